// The remote tier as a medium of the store (store/source.h): a StoreMedium
// whose source finds the blocks past the local prefix in the cluster and
// streams them layer by layer (RemoteFetch), and whose puts are published
// in the background (RemoteMedium::Publish). Registered by
// flatkv::RegisterRemoteMedium (flatkv/remote.h) where a store is composed;
// configured by StoreOptions::remote.
#pragma once

#include <memory>

#include "remote/remote_medium.h"
#include "store/source.h"

namespace flatkv::remote {

class RemoteStoreMedium final : public StoreMedium, public Source {
 public:
  // Null when options.remote names no seeds (or the store is read-only).
  static Result<std::unique_ptr<StoreMedium>> Open(const MediumContext& context);

  // StoreMedium
  const char* name() const override { return "remote"; }
  Source* source() override { return this; }
  void OnPut(std::span<const BlockKey> keys, std::span<const std::byte> data) override { medium_->Publish(keys, data); }
  void AddStats(StoreStats* stats) const override { stats->remote = medium_->Stats(); }
  void Stop() override { medium_->Stop(); }

  // Source: past the index; its fetch verifies every object it streams.
  Medium medium() const override { return Medium::kRemote; }
  std::unique_ptr<Fetch> Find(std::span<const BlockKey> chain, uint32_t from) override;

 private:
  RemoteStoreMedium(std::unique_ptr<RemoteMedium> medium, uint32_t layers) : medium_(std::move(medium)), layers_(layers) {}
  std::unique_ptr<RemoteMedium> medium_;
  uint32_t layers_;
};

}  // namespace flatkv::remote
