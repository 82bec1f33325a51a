// The "tiered" baseline: a model of Mooncake Store with SSD offload
// (bucket_storage_backend, offload on evict, promotion on hit). Every
// parameter below is tied to its source in docs/baselines.md.
//
// Model, per trace block (one Mooncake object per block):
//   - Put goes to the DRAM pool, global to the node's instances (Mooncake's
//     segments are pooled). The pool is dram_bytes less the staging buffers,
//     one per serving instance's client, carved out of the same DRAM.
//   - DRAM eviction is Mooncake's approximate LRU: when the pool reaches its
//     90% high watermark (or a put does not fit) a cycle evicts ceil(5% of the
//     objects), those whose lease has expired, earliest lease timeout first.
//     A read grants a lease to now + 5 s; an object never read is ordered by
//     its put time. Objects under lease are skipped.
//   - An evicted object without an SSD copy is appended, in eviction order,
//     to the open bucket; a bucket closes at 500 keys or when the next object
//     would take its data past 256 MB. Records are [key | value] back to
//     back, so an object's value sits at an arbitrary byte offset.
//   - SSD space is reclaimed a whole bucket at a time, oldest first (FIFO),
//     before a write that would exceed ssd_bytes.
//   - An SSD hit is one read per object (BatchLoad issues one preadv per
//     key), of the 4 KiB-aligned span around the value, into the staging
//     buffer of the reading instance's client; each object takes
//     align_up(size, 4 KiB) + 8 KiB of staging. Hold times come from the
//     run's IoModel (PolicyConfig::io_model), reads serial per key.
//     A restore streams through min(its need, free staging) and holds it
//     until its reads finish. When less than one object of staging is free,
//     the restore's SSD reads are aborted and the usable prefix ends at its
//     first SSD object. With promotion on hit (TieredOptions::promote:
//     tiered, tiered-lw) a read object is promoted back into DRAM (its SSD
//     copy stays in its bucket until the bucket is evicted); without it
//     (tiered-nopromo, tiered-lw-nopromo: Mooncake's default,
//     --promotion_on_hit false) it is served from staging and stays on SSD
//     only.
//   - Layer-wise (TieredOptions::layerwise, tiered-lw*: SGLang HiCache over
//     Mooncake): the DRAM part streams to the GPU layer by layer; the SSD
//     part, objects holding every layer, is read whole into host memory
//     before its first layer can cross (CachePolicy::ssd_layerwise false).
//
// IoMode::kReal performs the bucket I/O on real files under config.dir, every
// size divided by config.scale (the model's accounting, and so its hits, stay
// unscaled): demoted records are appended in eviction order to
// <dir>/<bucket id>.bucket with write() + fsync (pending records are written
// when an insert ends, when their bucket closes, or before one of them is
// read); an SSD hit is one buffered pread per object at its own offset, after
// posix_fadvise(DONTNEED) on the bucket, into a staging buffer; reclaiming a
// bucket deletes its file. A value carries its block id, checked on read; a
// failed or wrong read is a miss (the object is dropped), never wrong data.
// DRAM hits move no real bytes, as in the files policy's hot cache.
//
// Thread-safety: none; driven by one simulator thread.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

#include "replay/baselines.h"
#include "replay/io_model.h"

namespace flatkv::replay {
namespace {

constexpr double kHighWatermark = 0.90;                 // --eviction_high_watermark_ratio
constexpr double kEvictionRatio = 0.05;                 // --eviction_ratio
constexpr double kLeaseTtlS = 5.0;                      // DEFAULT_DEFAULT_KV_LEASE_TTL = 5000 ms
constexpr uint64_t kBucketSizeLimit = 256ull << 20;     // MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES
constexpr uint32_t kBucketKeysLimit = 500;              // MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT
constexpr uint64_t kStagingBytes = 1342177280ull;       // MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES (1.25 GiB)
constexpr uint64_t kDirectIoAlign = 4096;               // kDirectIOAlignment in BatchLoad / AllocateBatch
constexpr uint64_t kKeyBytes = 96;                      // assumed key string length (engine prefix + hash)
constexpr uint64_t kMetaBytesPerKey = kKeyBytes + 24;   // .meta: key + {offset, key_size, data_size}

uint64_t AlignDown(uint64_t x, uint64_t a) { return x / a * a; }
uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

class TieredPolicy final : public CachePolicy {
 public:
  TieredPolicy(const PolicyConfig& c, TieredOptions o)
      : options_(o),
        name_(std::string("tiered") + (o.layerwise ? "-lw" : "") + (o.promote ? "" : "-nopromo")),
        bb_(c.block_bytes),
        instances_(std::max<uint32_t>(1, c.instances)),
        staging_cap_(std::min<uint64_t>(kStagingBytes, c.dram_bytes / 4 / instances_)),
        pool_cap_(c.dram_bytes - staging_cap_ * instances_),
        ssd_cap_(c.ssd_bytes),
        staging_per_obj_(AlignUp(c.block_bytes, kDirectIoAlign) + 2 * kDirectIoAlign),
        real_(c.io == IoMode::kReal),
        dir_(c.dir),
        real_key_(static_cast<uint64_t>(double(kKeyBytes) / c.scale)),
        real_val_(std::max<uint64_t>(sizeof(uint64_t), static_cast<uint64_t>(double(c.block_bytes) / c.scale))),
        real_staging_(std::max<uint64_t>(real_val_, static_cast<uint64_t>(double(staging_cap_) / c.scale))),
        io_(c.io_model ? *c.io_model : IoModel{}),
        clients_(instances_) {}

  std::string_view name() const override { return name_; }
  bool layerwise() const override { return options_.layerwise; }

  LookupResult Lookup(const Request& req, uint32_t instance, double now) override {
    LookupResult r;
    if (real_) r.real_restore_s = 0;
    Client& client = clients_[instance % instances_];
    ReleaseStaging(client, now);
    // Pass 1: the found prefix; DRAM objects are leased, as the master grants
    // a lease to every key a Get queries before reading.
    size_t found = 0;
    uint32_t ssd_found = 0;
    for (; found < req.blocks.size(); ++found) {
      auto it = map_.find(req.blocks[found]);
      if (it == map_.end()) break;
      if (it->second.in_dram) {
        Order(it->second, req.blocks[found], now + kLeaseTtlS);
      } else {
        ++ssd_found;
      }
    }
    // Staging for the SSD part: pipelined through what is free, but at least
    // one object's worth must be free or the read is aborted.
    const uint64_t free_staging = staging_cap_ - client.staging_held;
    const bool staging_ok = ssd_found == 0 || free_staging >= staging_per_obj_;
    double read_s = 0;
    for (size_t i = 0; i < found; ++i) {
      auto it = map_.find(req.blocks[i]);
      if (it == map_.end()) break;  // its bucket was reclaimed by an earlier promotion's demotions
      Entry& e = it->second;
      if (e.in_dram) {
        ++r.hit_blocks;
        ++r.dram_blocks;
        r.dram_bytes_read += bb_;
        ++r.dram_requests;
        continue;
      }
      if (!staging_ok) {
        r.aborted_blocks = ssd_found;  // every SSD object of the found prefix from here on
        break;
      }
      if (real_) {
        double s = 0;
        if (!ReadObject(req.blocks[i], e, &s)) {  // a failed read is a miss: the object is dropped
          e.bucket = -1;
          map_.erase(it);
          ++evicted_;
          break;
        }
        r.real_restore_s += s;
      }
      const uint64_t start = e.value_off;
      const uint64_t span = AlignUp(start + bb_, kDirectIoAlign) - AlignDown(start, kDirectIoAlign);
      ++r.hit_blocks;
      ++r.ssd_blocks;
      r.ssd_bytes_read += span;
      r.ssd_bytes_useful += bb_;
      ++r.ssd_requests;
      --ssd_found;
      read_s += double(span) / (io_.ssd_read_gbps * 1e9) + io_.ssd_request_us * 1e-6;  // serial per key
      if (options_.promote) Promote(req.blocks[i], now);
    }
    if (r.ssd_blocks > 0) {
      const uint64_t hold = std::min<uint64_t>(uint64_t{r.ssd_blocks} * staging_per_obj_, free_staging);
      client.staging_held += hold;
      client.staging.push({now + read_s, hold});
    }
    return r;
  }

  InsertResult Insert(const Request& req, uint32_t /*instance*/, uint32_t hit_blocks, double now) override {
    InsertResult w;
    for (size_t i = hit_blocks; i < req.blocks.size(); ++i) {
      const uint64_t id = req.blocks[i];
      if (map_.count(id)) continue;  // Put of an existing key is rejected
      Entry& e = map_[id];
      if (!PlaceInDram(id, e, now, /*order_key=*/now)) {
        map_.erase(id);
        continue;
      }
      w.dram_bytes_written += bb_;
    }
    // Demotions since the last insert (including those a lookup's promotions caused).
    w.ssd_bytes_written = pending_ssd_bytes_;
    w.ssd_requests = pending_ssd_requests_;
    pending_ssd_bytes_ = 0;
    pending_ssd_requests_ = 0;
    if (real_) {
      Flush();
      w.real_write_s = pending_real_write_s_;
      pending_real_write_s_ = 0;
    }
    return w;
  }

  PolicyStats Stats() const override {
    PolicyStats s;
    s.dram_used_bytes = dram_used_;
    for (const Client& c : clients_) s.dram_used_bytes += c.staging_held;
    s.ssd_used_bytes = ssd_used_;
    s.evicted_blocks = evicted_;
    s.migrated_blocks = migrated_;
    return s;
  }

 private:
  struct Entry {
    bool in_dram = false;
    std::multimap<double, uint64_t>::iterator ord;  // valid when in_dram; key: lease timeout
    int64_t bucket = -1;                 // bucket id of the SSD copy, -1 if none
    uint64_t value_off = 0;              // byte offset of the value in its bucket file
    uint64_t real_off = 0;               // kReal: offset of the value in the real (scaled) bucket file
  };
  struct Bucket {
    std::vector<uint64_t> keys;
    uint64_t data_bytes = 0;             // values only (the grouping limit)
    uint64_t file_bytes = 0;             // records + metadata (what the quota counts)
    uint64_t real_bytes = 0;             // kReal: records appended so far (scaled), pending included
    uint64_t real_written = 0;           // kReal: of those, written and fsynced
    bool real_ok = true;                 // kReal: false once a write to the file failed
  };
  struct Hold {
    double release_s;
    uint64_t bytes;
    bool operator>(const Hold& o) const { return release_s > o.release_s; }
  };
  // A serving instance's Mooncake client: its own staging buffer
  // (MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES is a per-client setting).
  struct Client {
    std::priority_queue<Hold, std::vector<Hold>, std::greater<>> staging;
    uint64_t staging_held = 0;
  };

  void Order(Entry& e, uint64_t id, double key) {
    if (e.ord->first >= key) return;  // a lease never shortens
    order_.erase(e.ord);
    e.ord = order_.emplace(key, id);
  }

  void ReleaseStaging(Client& c, double now) {
    while (!c.staging.empty() && c.staging.top().release_s <= now) {
      c.staging_held -= c.staging.top().bytes;
      c.staging.pop();
    }
  }

  // One eviction cycle; returns the number of objects evicted.
  uint64_t EvictCycle(double now) {
    const uint64_t target = static_cast<uint64_t>(std::ceil(double(order_.size()) * kEvictionRatio));
    uint64_t n = 0;
    while (n < target && !order_.empty() && order_.begin()->first <= now) {  // the rest hold leases
      const uint64_t id = order_.begin()->second;
      Entry& e = map_.at(id);
      order_.erase(order_.begin());
      e.in_dram = false;
      dram_used_ -= bb_;
      ++n;
      if (e.bucket < 0 && !Demote(id, e)) {
        map_.erase(id);
        ++evicted_;
      }
    }
    return n;
  }

  bool PlaceInDram(uint64_t id, Entry& e, double now, double order_key) {
    if (bb_ > pool_cap_) return false;
    while (dram_used_ + bb_ > pool_cap_) {
      if (EvictCycle(now) == 0) return false;  // everything left is under lease
    }
    e.in_dram = true;
    e.ord = order_.emplace(order_key, id);
    dram_used_ += bb_;
    if (double(dram_used_) >= kHighWatermark * double(pool_cap_)) EvictCycle(now);
    return true;
  }

  void Promote(uint64_t id, double now) {
    Entry& e = map_.at(id);
    promoting_ = id;  // its bucket may be reclaimed meanwhile, but the entry must survive
    if (PlaceInDram(id, e, now, /*order_key=*/now + kLeaseTtlS)) {
      ++migrated_;
    } else if (e.bucket < 0) {
      map_.erase(id);  // lost its SSD copy and found no DRAM room: served from staging, then gone
      ++evicted_;
    }
    promoting_ = kNoBlock;
  }

  // Appends `id` to the open bucket; false when it cannot fit on the SSD.
  bool Demote(uint64_t id, Entry& e) {
    const uint64_t rec = kKeyBytes + bb_;
    const uint64_t file = rec + kMetaBytesPerKey;
    if (file > ssd_cap_) return false;
    if (!open_ || Open().keys.size() >= kBucketKeysLimit ||
        (!Open().keys.empty() && Open().data_bytes + bb_ > kBucketSizeLimit)) {
      CloseOpen();
      buckets_.emplace_back();
      open_ = true;
    }
    while (ssd_used_ + file > ssd_cap_) EvictOldestBucket();
    if (!open_) {  // the open bucket itself was evicted to make room
      buckets_.emplace_back();
      open_ = true;
    }
    Bucket& b = Open();
    e.bucket = first_bucket_id_ + int64_t(buckets_.size()) - 1;
    e.value_off = b.file_bytes - b.keys.size() * kMetaBytesPerKey + kKeyBytes;  // records only, then the key
    if (real_) AppendRecord(id, e, b);
    b.keys.push_back(id);
    b.data_bytes += bb_;
    b.file_bytes += file;
    ssd_used_ += file;
    pending_ssd_bytes_ += rec;
    ++migrated_;
    return true;
  }

  Bucket& Open() { return buckets_.back(); }

  void CloseOpen() {
    if (real_) Flush();
    if (open_ && !Open().keys.empty()) ++pending_ssd_requests_;  // one WriteBucket per bucket
    open_ = false;
  }

  void EvictOldestBucket() {
    Bucket& b = buckets_.front();
    for (uint64_t id : b.keys) {
      auto it = map_.find(id);
      if (it == map_.end() || it->second.bucket != first_bucket_id_) continue;
      it->second.bucket = -1;
      if (!it->second.in_dram && id != promoting_) {
        map_.erase(it);
        ++evicted_;
      }
    }
    ssd_used_ -= b.file_bytes;
    if (real_) {
      if (buckets_.size() == 1 && open_) pending_.clear();  // the open bucket: its pending records go too
      ::unlink(BucketPath(first_bucket_id_).c_str());
    }
    buckets_.pop_front();
    ++first_bucket_id_;
    if (buckets_.empty()) open_ = false;
  }

  const TieredOptions options_;
  const std::string name_;
  const uint64_t bb_;
  const uint32_t instances_;
  const uint64_t staging_cap_;  // per client
  const uint64_t pool_cap_;
  const uint64_t ssd_cap_;
  const uint64_t staging_per_obj_;
  // ---- kReal -----------------------------------------------------------------

  std::string BucketPath(int64_t bucket) const { return dir_ + "/" + std::to_string(bucket) + ".bucket"; }

  // Queues [key | value] for the open bucket `b`; the value starts with `id`.
  void AppendRecord(uint64_t id, Entry& e, Bucket& b) {
    const size_t at = pending_.size();
    pending_.resize(at + real_key_ + real_val_, 0x5a);
    std::memcpy(pending_.data() + at, &id, std::min<uint64_t>(real_key_, sizeof(id)));
    std::memcpy(pending_.data() + at + real_key_, &id, sizeof(id));
    e.real_off = b.real_bytes + real_key_;
    b.real_bytes += real_key_ + real_val_;
  }

  // Writes the open bucket's pending records with write() + fsync; the time
  // goes to the next InsertResult. A failure marks the bucket unreadable.
  void Flush() {
    if (pending_.empty()) return;
    if (!open_ || buckets_.empty()) {
      pending_.clear();
      return;
    }
    Bucket& b = Open();
    const std::string path = BucketPath(first_bucket_id_ + int64_t(buckets_.size()) - 1);
    const auto t0 = std::chrono::steady_clock::now();
    bool ok = b.real_ok;
    const int fd = ok ? ::open(path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644) : -1;
    ok = fd >= 0;
    uint64_t done = 0;
    while (ok && done < pending_.size()) {
      const ssize_t n = ::pwrite(fd, pending_.data() + done, pending_.size() - done,
                                 static_cast<off_t>(b.real_written + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) ok = false;
      else done += static_cast<uint64_t>(n);
    }
    if (ok && ::fsync(fd) != 0) ok = false;
    if (fd >= 0) ::close(fd);
    pending_real_write_s_ += Seconds(t0, std::chrono::steady_clock::now());
    if (ok) {
      b.real_written += pending_.size();
    } else {
      b.real_ok = false;
    }
    pending_.clear();
  }

  // One buffered pread of `id`'s value at its own offset in its bucket, after
  // dropping the bucket's cached pages; `*s` gets the read's seconds. False
  // when the file or the bytes are not there or are not `id`'s.
  bool ReadObject(uint64_t id, const Entry& e, double* s) {
    if (e.bucket < first_bucket_id_ || e.bucket >= first_bucket_id_ + int64_t(buckets_.size())) return false;
    const size_t idx = static_cast<size_t>(e.bucket - first_bucket_id_);
    if (open_ && idx + 1 == buckets_.size() && e.real_off + real_val_ > buckets_[idx].real_written) Flush();
    const Bucket& b = buckets_[idx];
    if (!b.real_ok || e.real_off + real_val_ > b.real_written) return false;
    if (staging_buf_.empty()) staging_buf_.assign(real_staging_, 0);
    if (staging_at_ + real_val_ > staging_buf_.size()) staging_at_ = 0;
    char* dst = staging_buf_.data() + staging_at_;
    staging_at_ += real_val_;
    const std::string path = BucketPath(e.bucket);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t done = 0;
    bool ok = true;
    while (done < real_val_) {
      const ssize_t n = ::pread(fd, dst + done, real_val_ - done, static_cast<off_t>(e.real_off + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ok = false;
        break;
      }
      done += static_cast<uint64_t>(n);
    }
    *s = Seconds(t0, std::chrono::steady_clock::now());
    ::close(fd);
    if (!ok) return false;
    uint64_t got = 0;
    std::memcpy(&got, dst, sizeof(got));
    return got == id;
  }


  std::unordered_map<uint64_t, Entry> map_;
  std::multimap<double, uint64_t> order_;  // DRAM objects by lease timeout: eviction order
  uint64_t dram_used_ = 0;
  std::deque<Bucket> buckets_;  // oldest first; the last is open while open_
  int64_t first_bucket_id_ = 0;
  bool open_ = false;
  uint64_t ssd_used_ = 0;
  uint64_t pending_ssd_bytes_ = 0;
  uint32_t pending_ssd_requests_ = 0;
  uint64_t evicted_ = 0;
  uint64_t migrated_ = 0;
  static constexpr uint64_t kNoBlock = ~0ull;
  uint64_t promoting_ = kNoBlock;

  const bool real_;
  const std::string dir_;
  const uint64_t real_key_;      // scaled key bytes of a record
  const uint64_t real_val_;      // scaled value bytes of a record (at least the id stamp)
  const uint64_t real_staging_;  // scaled staging buffer bytes
  std::vector<char> pending_;    // records appended to the open bucket, not yet written
  double pending_real_write_s_ = 0;
  std::vector<char> staging_buf_;
  uint64_t staging_at_ = 0;
  const IoModel io_;              // the run's figures: they time staging holds
  std::vector<Client> clients_;   // one per serving instance
};

}  // namespace

Result<std::unique_ptr<CachePolicy>> MakeTieredPolicy(const PolicyConfig& config, TieredOptions options) {
  if (config.block_bytes == 0) return Status::InvalidArgument("tiered: block_bytes must be > 0");
  if (config.io == IoMode::kReal) {
    if (config.dir.empty()) return Status::InvalidArgument("tiered: kReal needs a scratch directory (config.dir)");
    if (!(config.scale >= 1.0))
      return Status::InvalidArgument("tiered: scale must be >= 1, got " + std::to_string(config.scale));
    if (::mkdir(config.dir.c_str(), 0755) != 0 && errno != EEXIST)
      return Status::FromErrno(errno, "tiered: mkdir " + config.dir);
  }
  return std::unique_ptr<CachePolicy>(new TieredPolicy(config, options));
}

}  // namespace flatkv::replay
