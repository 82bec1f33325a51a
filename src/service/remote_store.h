// RemoteStore: the Store interface over a Client, so code written against
// an in-process Store (the reference engine, a connector) runs unchanged
// against a `flatkv serve` daemon.
//
// Differences from a local Store: a restore is carried out in full inside
// StartRestore (WaitLayer then returns at once, so there is no overlap of
// loading with compute); with a RestoreTarget the bytes arrive over the
// socket and are copied to the destinations, otherwise the whole restored
// prefix is held in memory until the Restore is destroyed. locations()
// report Medium::kNone (the daemon does not say where blocks live).
// DropSession, Prefetch, Retain and TruncateSession are the daemon's
// (protocol versions 2, 3 and 4);
// Stats() carries no counters (ask the daemon: Client::StatsJson).
//
// Thread-safety: as the Client's: calls are serialized on its connection.
#pragma once

#include <memory>

#include "flatkv/store.h"
#include "service/client.h"

namespace flatkv::service {

class RemoteStore final : public Store {
 public:
  explicit RemoteStore(std::unique_ptr<Client> client);

  Status Put(SessionId session, std::span<const BlockKey> keys, std::span<const std::byte> data,
             const PutOptions& options = {}) override;
  uint32_t Match(std::span<const BlockKey> chain) const override;
  Result<std::unique_ptr<flatkv::Restore>> StartRestore(std::span<const BlockKey> chain,
                                                        const RestoreTarget& target = {}) override;
  Status DropSession(SessionId session) override;
  Result<uint32_t> Prefetch(std::span<const BlockKey> chain) override;
  Result<uint32_t> TruncateSession(SessionId session, uint32_t keep_blocks) override;
  Result<uint32_t> Retain(std::span<const BlockKey> chain, std::chrono::milliseconds ttl) override;
  // Built in the daemon (protocol 6), its bytes never cross the socket.
  Result<PruneResult> Prune(std::span<const BlockKey> chain, std::span<const TokenRange> ranges,
                            const PutOptions& options = {}) override;
  Status Close() override;
  StoreStats Stats() const override;
  const StoreOptions& options() const override { return options_; }
  uint64_t BlockLayerBytes() const override { return client_->info().block_layer_bytes; }
  uint64_t BlockBytes() const override { return client_->info().block_bytes; }
  Client& client() { return *client_; }

 private:
  std::unique_ptr<Client> client_;
  StoreOptions options_;  // shape and block_tokens as the daemon announced them
  bool closed_ = false;
};

}  // namespace flatkv::service
