#include "remote/remote_source.h"

#include "flatkv/remote.h"

#include <algorithm>

#include "common/log.h"

namespace flatkv::remote {
namespace {

// The blocks chain[match.from .. match.blocks) as one run of a restore,
// fetched on the remote medium's restore thread: each layer's objects are
// verified as they arrive (RemoteTier::Restore) and written where the
// restore lands them; a missing or corrupt one cuts the valid prefix.
class RemoteFetch final : public Fetch {
 public:
  RemoteFetch(RemoteMedium* medium, uint32_t layers, std::span<const BlockKey> chain, RemoteMatch match)
      : medium_(medium), layers_(layers), chain_(chain), match_(std::move(match)) {}
  uint32_t from() const override { return match_.from; }
  uint32_t blocks() const override { return match_.blocks; }
  bool Start(FetchSink* sink) override {
    return medium_->Submit([this, sink](RemoteTier& tier, const BlockKey& ns) { Run(tier, ns, sink); });
  }

 private:
  void Run(RemoteTier& tier, const BlockKey& ns, FetchSink* sink) {
    const uint32_t from = match_.from, count = match_.blocks - match_.from;
    // Counted before the last layer settles, so a consumer that finished sees it.
    bool noted = false;
    auto note = [&](uint32_t end) {
      if (!noted) medium_->NoteRestore(count, chain_.subspan(from, end - from), tier);
      noted = true;
    };
    auto destination = [&](uint32_t layer, uint32_t block) { return sink->AwaitLanding(layer, block); };
    auto layer_done = [&](uint32_t layer, uint32_t valid) {
      if (layer + 1 == layers_) note(valid);
      return sink->SettleThrough(layer, valid);
    };
    auto got = tier.Restore(ns, chain_, match_, destination, layer_done);
    if (!got.ok()) LogWarning("restore: remote tier: " + got.status().ToString() + "; its blocks are misses");
    const uint32_t end = got.ok() ? *got : from;
    note(end);
    sink->End(end);
  }

  RemoteMedium* medium_;
  uint32_t layers_;
  std::span<const BlockKey> chain_;  // the restore's, which outlives its fetch
  RemoteMatch match_;
};

}  // namespace

Result<std::unique_ptr<StoreMedium>> RemoteStoreMedium::Open(const MediumContext& context) {
  const StoreOptions& o = context.options;
  if (o.remote.seeds.empty() || o.read_only) return std::unique_ptr<StoreMedium>();
  RemoteOptions remote = o.remote;
  if (remote.publish_buffer_bytes == 0)
    remote.publish_buffer_bytes = std::max<uint64_t>(256ull << 20, o.dram_capacity_bytes / 16);
  // With an SSD directory, what this store published is kept beside its
  // data, so capacity_bytes counts an earlier run's objects too.
  const std::string held_log = o.ssd_dirs.empty() ? std::string() : o.ssd_dirs[0] + "/remote-held.log";
  FLATKV_ASSIGN_OR_RETURN(auto medium,
                          RemoteMedium::Open(remote, o.shape, o.block_tokens, context.block_layer_bytes, held_log));
  return std::unique_ptr<StoreMedium>(new RemoteStoreMedium(std::move(medium), o.shape.layers));
}

std::unique_ptr<Fetch> RemoteStoreMedium::Find(std::span<const BlockKey> chain, uint32_t from) {
  auto m = medium_->Lookup(chain, from);
  if (!m) return nullptr;
  return std::make_unique<RemoteFetch>(medium_.get(), layers_, chain, std::move(*m));
}

}  // namespace flatkv::remote

namespace flatkv {

void RegisterRemoteMedium() { RegisterMedium(MediumDescriptor{"remote", &remote::RemoteStoreMedium::Open}); }

}  // namespace flatkv
