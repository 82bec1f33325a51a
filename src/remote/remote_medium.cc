#include "remote/remote_medium.h"

#include "remote/held_log.h"

#include <cstring>

#include "common/log.h"

namespace flatkv::remote {
namespace {

ClusterOptions ClusterOf(const RemoteOptions& o) {
  ClusterOptions c;
  c.seeds = o.seeds;
  c.user = o.user;
  c.password = o.password;
  c.tls = o.tls;
  c.tls_ca_file = o.tls_ca_file;
  c.tls_verify = o.tls_verify;
  c.timeout = o.timeout;
  return c;
}

// How long a closing store gives its publish queue before it stops.
constexpr auto kCloseDrain = std::chrono::seconds(5);

}  // namespace

Result<std::unique_ptr<RemoteMedium>> RemoteMedium::Open(const RemoteOptions& options, const KvShape& shape,
                                                         uint32_t block_tokens, uint64_t block_layer_bytes,
                                                         const std::string& held_log) {
  if (options.seeds.empty()) return Status::InvalidArgument("remote tier: no seeds (host:port of cluster nodes)");
  if (options.timeout.count() <= 0) return Status::InvalidArgument("remote tier: timeout must be positive");
  std::unique_ptr<RemoteMedium> m(new RemoteMedium());
  m->options_ = options;
  m->layers_ = shape.layers;
  m->slice_bytes_ = block_layer_bytes;
  // Blocks of another shape or block size never match: their objects carry
  // another namespace digest.
  KeyHasher h;
  m->ns_ = h.NamespaceDigest({"flatkv-store",
                              std::to_string(shape.layers) + "x" + std::to_string(block_layer_bytes) + "B/" +
                                  std::to_string(block_tokens) + "t/" + std::string(DTypeName(shape.dtype)),
                              ""});
  RemoteTierOptions t;
  t.cluster = ClusterOf(options);
  t.prefix = options.prefix;
  t.object_bytes = options.object_bytes;
  t.max_inflight = options.max_inflight;
  t.ttl_seconds = options.ttl_seconds;
  auto where = [&](const Status& s) {
    std::string seeds;
    for (const auto& x : options.seeds) seeds += (seeds.empty() ? "" : ",") + x;
    return s.WithContext("remote tier (seeds " + seeds + ")");
  };
  auto restore = RemoteTier::Open(t, shape.layers, block_layer_bytes);
  if (!restore.ok()) return where(restore.status());
  auto publish = RemoteTier::Open(t, shape.layers, block_layer_bytes);
  if (!publish.ok()) return where(publish.status());
  t.cluster.retry_for = options.timeout;  // a lookup gives up rather than waiting out a failover
  auto lookup = RemoteTier::Open(t, shape.layers, block_layer_bytes);
  if (!lookup.ok()) return where(lookup.status());
  m->restore_tier_ = std::move(restore).value();
  m->publish_tier_ = std::move(publish).value();
  {
    MutexLock lock(&m->lookup_mu_);
    m->lookup_tier_ = std::move(lookup).value();
  }
  uint64_t held_bytes = 0;
  if (!held_log.empty()) {
    auto log = HeldLog::Open(held_log, &m->held_);
    if (!log.ok()) return log.status();
    m->held_log_ = std::move(log).value();
    for (const PublishedPiece& p : m->held_) held_bytes += p.bytes;
  }
  {
    MutexLock lock(&m->mu_);
    m->stats_.enabled = true;
    m->stats_.capacity_bytes = options.capacity_bytes;
    m->stats_.held_bytes = held_bytes;  // an earlier run's pieces count too
  }
  RemoteMedium* raw = m.get();
  m->publisher_ = std::thread([raw] { raw->PublishLoop(); });
  m->restorer_ = std::thread([raw] { raw->RestoreLoop(); });
  return m;
}

RemoteMedium::~RemoteMedium() { Stop(); }

void RemoteMedium::Stop() {
  const auto deadline = std::chrono::steady_clock::now() + kCloseDrain;
  for (;;) {
    MutexLock lock(&mu_);
    if ((publish_queue_.empty() && !publishing_) || std::chrono::steady_clock::now() >= deadline) {
      if (!publish_queue_.empty())
        LogWarning("remote tier: closing with " + std::to_string(publish_queue_.size()) + " puts not published");
      stopping_ = true;
      cv_.SignalAll();
      break;
    }
    mu_.Unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    mu_.Lock();
  }
  if (publisher_.joinable()) publisher_.join();
  if (restorer_.joinable()) restorer_.join();
}

void RemoteMedium::Publish(std::span<const BlockKey> keys, std::span<const std::byte> data) {
  if (keys.empty()) return;
  MutexLock lock(&mu_);
  if (stopping_) return;
  const uint64_t block_bytes = data.size() / keys.size();
  // What a restore just found in the cluster (a write-back) is there already.
  size_t skip = 0;
  while (skip < keys.size() && known_.count(keys[skip])) ++skip;
  stats_.already_published_blocks += skip;
  keys = keys.subspan(skip);
  data = data.subspan(skip * block_bytes);
  if (keys.empty()) return;
  // The leading blocks that fit are queued (a chain is reused from its
  // start), the rest dropped.
  const uint64_t room = options_.publish_buffer_bytes - std::min(options_.publish_buffer_bytes, stats_.publish_queued_bytes);
  const size_t fit = static_cast<size_t>(std::min<uint64_t>(keys.size(), block_bytes ? room / block_bytes : keys.size()));
  stats_.publish_dropped_blocks += keys.size() - fit;
  if (fit == 0) return;
  stats_.publish_queued_blocks += fit;
  stats_.publish_queued_bytes += fit * block_bytes;
  PublishJob job{{keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(fit)}, {}};
  mu_.Unlock();
  job.data.assign(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(fit * block_bytes));  // the copy outside the lock
  mu_.Lock();
  publish_queue_.push_back(std::move(job));
  cv_.SignalAll();
}

void RemoteMedium::TrimToCapacity() {
  uint64_t held;
  {
    MutexLock lock(&mu_);
    held = stats_.held_bytes;
  }
  uint64_t deleted_bytes = 0, deleted_blocks = 0, pieces = 0;
  while (options_.capacity_bytes && held - deleted_bytes > options_.capacity_bytes && !held_.empty()) {
    auto gone = publish_tier_->Delete(held_.front().names);
    if (!gone.ok()) {
      LogWarning("remote tier: deleting published objects past capacity_bytes: " + gone.status().ToString());
      break;
    }
    deleted_bytes += held_.front().bytes;
    deleted_blocks += held_.front().blocks;
    held_.pop_front();
    ++pieces;
  }
  if (pieces > 0 && held_log_) {
    if (Status logged = held_log_->Deleted(pieces, held_); !logged.ok()) LogWarning(logged.ToString());
  }
  MutexLock lock(&mu_);
  stats_.held_bytes -= deleted_bytes;
  stats_.capacity_deleted_blocks += deleted_blocks;
}

void RemoteMedium::PublishLoop() {
  TrimToCapacity();  // an earlier run may have left more than the cap now allows
  for (;;) {
    PublishJob job;
    {
      MutexLock lock(&mu_);
      while (publish_queue_.empty() && !stopping_) cv_.Wait(&mu_);
      if (publish_queue_.empty()) return;
      job = std::move(publish_queue_.front());
      publish_queue_.pop_front();
      publishing_ = true;
    }
    const uint64_t block_bytes = uint64_t{layers_} * slice_bytes_;
    std::vector<PublishedPiece> written;
    Status s = publish_tier_->Publish(
        ns_, job.keys,
        [&](uint32_t layer, uint32_t block) { return job.data.data() + block * block_bytes + layer * slice_bytes_; },
        &written);
    if (!s.ok()) LogWarning("remote tier: publishing " + std::to_string(job.keys.size()) + " blocks: " + s.ToString());
    // Within capacity_bytes: the oldest pieces go.
    uint64_t added = 0;
    for (auto& p : written) {
      added += p.bytes;
      if (held_log_) {
        if (Status logged = held_log_->Published(p); !logged.ok())
          LogWarning(logged.ToString() + "; this piece is not counted after a restart");
      }
      held_.push_back(std::move(p));
    }
    {
      MutexLock lock(&mu_);
      stats_.held_bytes += added;
    }
    TrimToCapacity();
    MutexLock lock(&mu_);
    Absorb(publish_tier_->stats(), &publish_seen_);
    if (!s.ok()) stats_.publish_errors++;
    stats_.publish_queued_blocks -= job.keys.size();
    stats_.publish_queued_bytes -= job.data.size();
    publishing_ = false;
    cv_.SignalAll();
  }
}

std::optional<RemoteMatch> RemoteMedium::Lookup(std::span<const BlockKey> chain, uint32_t from) {
  if (from >= chain.size()) return std::nullopt;
  {
    MutexLock lock(&mu_);
    if (std::chrono::steady_clock::now() < skip_until_) {
      stats_.lookups_skipped++;
      return std::nullopt;
    }
  }
  MutexLock one(&lookup_mu_);
  auto m = lookup_tier_->Match(chain, from);
  MutexLock lock(&mu_);
  Absorb(lookup_tier_->stats(), &lookup_seen_);
  stats_.lookups++;
  if (!m.ok()) {
    stats_.lookup_errors++;
    skip_until_ = std::chrono::steady_clock::now() + options_.backoff;
    LogWarning("remote tier: lookup: " + m.status().ToString() + "; restores skip the tier for " +
               std::to_string(options_.backoff.count()) + " ms");
    return std::nullopt;
  }
  if (m->blocks == from) return std::nullopt;
  return std::move(m).value();
}

bool RemoteMedium::Submit(Job job) {
  MutexLock lock(&mu_);
  if (stopping_) return false;
  restore_queue_.push_back(std::move(job));
  cv_.SignalAll();
  return true;
}

void RemoteMedium::RestoreLoop() {
  for (;;) {
    Job job;
    {
      MutexLock lock(&mu_);
      while (restore_queue_.empty() && !stopping_) cv_.Wait(&mu_);
      if (restore_queue_.empty()) return;
      job = std::move(restore_queue_.front());
      restore_queue_.pop_front();
    }
    job(*restore_tier_, ns_);
  }
}

void RemoteMedium::NoteRestore(uint32_t hit, std::span<const BlockKey> restored, const RemoteTier& tier) {
  MutexLock lock(&mu_);
  Absorb(tier.stats(), &restore_seen_);
  stats_.hit_blocks += hit;
  stats_.restored_blocks += restored.size();
  for (const BlockKey& k : restored) {
    if (!known_.insert(k).second) continue;
    known_order_.push_back(k);
    if (known_order_.size() > kKnownKeys) {
      known_.erase(known_order_.front());
      known_order_.pop_front();
    }
  }
}

void RemoteMedium::Drain() {
  MutexLock lock(&mu_);
  while (!publish_queue_.empty() || publishing_) cv_.Wait(&mu_);
}

RemoteStats RemoteMedium::Stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

void RemoteMedium::Absorb(const RemoteTierStats& now, RemoteTierStats* seen) {
  stats_.bytes_read += now.bytes_read - seen->bytes_read;
  stats_.stale_objects += now.stale_objects - seen->stale_objects;
  stats_.missing_objects += now.missing_objects - seen->missing_objects;
  stats_.published_blocks += now.blocks_published - seen->blocks_published;
  stats_.already_published_blocks += now.blocks_already_published - seen->blocks_already_published;
  stats_.published_bytes += now.bytes_written - seen->bytes_written;
  *seen = now;
}

}  // namespace flatkv::remote
