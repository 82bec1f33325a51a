// RemoteMedium: the store's remote tier (StoreOptions::remote), a Redis
// Cluster the nodes of a fleet share, beside DRAM and SSD with queues of
// its own (docs/remote.md).
//
// Publishing: Publish copies a put's blocks into a bounded buffer and
// returns (a put never waits for the cluster; past
// RemoteOptions::publish_buffer_bytes the blocks are not published, and
// counted); a publisher thread writes them as immutable objects and index
// entries (RemoteTier::Publish), skipping blocks already published.
//
// Restores: Lookup finds how far a chain's local miss is indexed, in one
// pipelined round on a client of its own whose requests give up after
// RemoteOptions::timeout (no failover retries); after a failure, restores
// skip the tier for RemoteOptions::backoff. Submit runs a restore's fetch on
// the medium's own thread and client, in order, so a slow cluster delays
// only the remote blocks, never the DRAM and SSD ones.
//
// Thread-safety: every method may be called concurrently.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <span>
#include <thread>
#include <unordered_set>
#include <vector>

#include "common/mutex.h"
#include "flatkv/options.h"
#include "flatkv/stats.h"
#include "remote/remote_tier.h"

namespace flatkv::remote {

class HeldLog;  // remote/held_log.h

class RemoteMedium {
 public:
  // Connects three clients (lookups, restores, publishing) to the cluster.
  // With `held_log` (a file path; empty: none), what this store published
  // is kept there across restarts (HeldLog), and capacity_bytes counts it.
  static Result<std::unique_ptr<RemoteMedium>> Open(const RemoteOptions& options, const KvShape& shape,
                                                    uint32_t block_tokens, uint64_t block_layer_bytes,
                                                    const std::string& held_log = {});
  // Stop: publishes what is queued (for at most a few seconds), runs the
  // restore jobs queued, then stops both threads; later Publish calls do
  // nothing and Submit refuses. The destructor stops too.
  void Stop() FLATKV_EXCLUDES(mu_);
  ~RemoteMedium();

  // Queues `keys` (consecutive blocks of one chain) for publishing, with
  // their put data (block-major: block b's layers at b * layers * slice).
  // Leading keys a restore found in the cluster are skipped (counted as
  // already published); of the rest, the leading blocks that fit the
  // publish buffer are queued and the others dropped.
  void Publish(std::span<const BlockKey> keys, std::span<const std::byte> data) FLATKV_EXCLUDES(mu_);

  // How far chain[from..] is indexed; nullopt when no block is (or the
  // lookup failed or was skipped).
  std::optional<RemoteMatch> Lookup(std::span<const BlockKey> chain, uint32_t from) FLATKV_EXCLUDES(lookup_mu_, mu_);

  // Runs job(tier, namespace digest) on the restore thread, after the jobs
  // submitted before it; false (the job will not run) once stopped.
  using Job = std::function<void(RemoteTier& tier, const BlockKey& ns)>;
  bool Submit(Job job) FLATKV_EXCLUDES(mu_);
  // A restore job's outcome, from the restore thread: `hit` blocks
  // fetched, `restored` the keys of those valid, and `tier`'s counters.
  // The restored keys are remembered as in the cluster (the newest
  // kKnownKeys): a put of them, as when the engine writes back what the
  // cluster supplied, does not queue them for publishing again.
  void NoteRestore(uint32_t hit, std::span<const BlockKey> restored, const RemoteTier& tier) FLATKV_EXCLUDES(mu_);
  static constexpr size_t kKnownKeys = 1 << 18;

  // Waits until nothing is queued for publishing or being published.
  void Drain() FLATKV_EXCLUDES(mu_);
  RemoteStats Stats() const FLATKV_EXCLUDES(mu_);
  const BlockKey& ns() const { return ns_; }

 private:
  struct PublishJob {
    std::vector<BlockKey> keys;
    std::vector<std::byte> data;
  };
  RemoteMedium() = default;
  void PublishLoop() FLATKV_EXCLUDES(mu_);
  // Deletes the oldest held pieces past capacity_bytes (the publisher's).
  void TrimToCapacity() FLATKV_EXCLUDES(mu_);
  void RestoreLoop() FLATKV_EXCLUDES(mu_);
  // Copies a tier's counters into stats_ (the tier's thread calls it).
  void Absorb(const RemoteTierStats& now, RemoteTierStats* seen) FLATKV_REQUIRES(mu_);

  RemoteOptions options_;
  uint32_t layers_ = 0;
  uint64_t slice_bytes_ = 0;
  BlockKey ns_;

  Mutex lookup_mu_;  // the lookup client, one lookup at a time
  std::unique_ptr<RemoteTier> lookup_tier_ FLATKV_GUARDED_BY(lookup_mu_);
  std::unique_ptr<RemoteTier> restore_tier_;  // the restore thread's
  std::unique_ptr<RemoteTier> publish_tier_;  // the publisher's

  mutable Mutex mu_;
  CondVar cv_;
  bool stopping_ FLATKV_GUARDED_BY(mu_) = false;
  std::deque<PublishJob> publish_queue_ FLATKV_GUARDED_BY(mu_);
  std::deque<PublishedPiece> held_;  // what this store published and keeps, oldest first (the publisher's)
  std::unique_ptr<HeldLog> held_log_;  // held_ on disk (the publisher's; null: none)
  bool publishing_ FLATKV_GUARDED_BY(mu_) = false;  // the publisher holds a job
  std::deque<Job> restore_queue_ FLATKV_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point skip_until_ FLATKV_GUARDED_BY(mu_){};
  RemoteStats stats_ FLATKV_GUARDED_BY(mu_);
  std::unordered_set<BlockKey, BlockKeyHash> known_ FLATKV_GUARDED_BY(mu_);  // restored from the cluster lately
  std::deque<BlockKey> known_order_ FLATKV_GUARDED_BY(mu_);                  // the same, oldest first
  RemoteTierStats lookup_seen_ FLATKV_GUARDED_BY(mu_), restore_seen_ FLATKV_GUARDED_BY(mu_),
      publish_seen_ FLATKV_GUARDED_BY(mu_);
  std::thread publisher_, restorer_;
};

}  // namespace flatkv::remote
