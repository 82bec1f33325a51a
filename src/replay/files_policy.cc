// The "files" baseline: a model of LMCache's LocalCPUBackend (a DRAM LRU hot
// cache) in front of its LocalDiskBackend (one file per chunk, LRU). Every
// parameter is tied to its source in docs/baselines.md.
//
// Model:
//   - One LMCache engine per serving instance (LMCache runs inside each vLLM
//     process): the node's DRAM and SSD capacities are split evenly among
//     them, and a request sees only its instance's caches.
//   - The cache unit is LMCache's chunk of 256 tokens. With trace blocks of
//     b <= 256 tokens a chunk is k = 256 / b blocks and is keyed by the id of
//     its last block (ids are prefix-chained, as LMCache's chunk hashes are);
//     a prompt's trailing partial chunk is not stored (save_unfull_chunk is
//     off). With b > 256 a block is ceil(b / 256) chunk files, read and
//     written as that many requests.
//   - A store writes every chunk not already cached to both the hot cache and
//     its own file (StorageManager.batched_put writes every backend).
//   - A lookup walks chunks in order: a hot-cache hit is a DRAM read; a disk
//     hit reads the whole file (one request, its full size) and writes the
//     chunk back into the hot cache; the first miss ends the prefix.
//   - Each tier evicts its least recently used chunk until the new one fits.
//   - Disk reads are synchronous in the caller, one chunk after another
//     (get_blocking); the simulator charges each its latency
//     (serial_ssd_reads). Puts go through the engine's one disk worker
//     thread asynchronously, as the offloads of every policy do.
//
// Layer-wise (files-lw, LMCache's use_layerwise: store_layer and
// retrieve_layer split each chunk key into num_layers per-layer keys,
// key.split_layers): a chunk is config.layers objects of chunk / layers
// bytes on both tiers, kept and evicted together (they are put and looked up
// together). A disk hit reads every layer's file, each a request whose
// buffered read brings whole 4 KiB pages; the layers stream to the GPU as
// they are read (ssd_layerwise), a layer's files read as one batch
// (layerwise_batched_get), so not serially. kModel only.
//
// IoMode::kReal performs those file reads and writes on real files under
// config.dir (sizes divided by config.scale), written with write()+fsync and
// read with buffered pread after posix_fadvise(DONTNEED), like LMCache's
// default (use_odirect is off) with the page cache dropped for the file.
//
// Thread-safety: none; driven by one simulator thread.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "replay/baselines.h"

namespace flatkv::replay {
namespace {

constexpr uint32_t kChunkTokens = 256;  // LMCache config chunk_size default

// An LRU set of chunk keys with a byte budget.
class LruBytes {
 public:
  explicit LruBytes(uint64_t cap) : cap_(cap) {}
  bool Contains(uint64_t k) const { return map_.count(k) != 0; }
  void Touch(uint64_t k) {
    auto it = map_.find(k);
    if (it != map_.end()) list_.splice(list_.end(), list_, it->second);
  }
  // Inserts `k` of `bytes`, evicting from the cold end; evicted keys are
  // appended to `out`. False (and nothing changes) when it can never fit.
  bool Put(uint64_t k, uint64_t bytes, std::vector<uint64_t>* out) {
    if (bytes > cap_) return false;
    while (used_ + bytes > cap_) {
      const uint64_t victim = list_.front();
      list_.pop_front();
      map_.erase(victim);
      used_ -= bytes;  // every unit has the same size
      out->push_back(victim);
    }
    map_[k] = list_.insert(list_.end(), k);
    used_ += bytes;
    return true;
  }
  void Erase(uint64_t k, uint64_t bytes) {
    auto it = map_.find(k);
    if (it == map_.end()) return;
    list_.erase(it->second);
    map_.erase(it);
    used_ -= bytes;
  }
  uint64_t used() const { return used_; }

 private:
  uint64_t cap_;
  uint64_t used_ = 0;
  std::list<uint64_t> list_;
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> map_;
};

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

class FilesPolicy final : public CachePolicy {
 public:
  FilesPolicy(const PolicyConfig& c, bool layerwise)
      : layerwise_(layerwise),
        layers_(layerwise ? std::max<uint32_t>(1, c.layers) : 1),
        blocks_per_chunk_(c.block_tokens <= kChunkTokens ? std::max<uint32_t>(1, kChunkTokens / c.block_tokens) : 1),
        files_per_chunk_(c.block_tokens <= kChunkTokens ? 1 : (c.block_tokens + kChunkTokens - 1) / kChunkTokens),
        chunk_bytes_(c.block_bytes * blocks_per_chunk_),
        real_(c.io == IoMode::kReal),
        dir_(c.dir),
        real_file_bytes_(static_cast<uint64_t>(double(chunk_bytes_) / files_per_chunk_ / c.scale)),
        instances_(std::max<uint32_t>(1, c.instances)) {
    // One LMCache engine per serving instance, each with its own hot cache
    // (max_local_cpu_size) and disk backend (max_local_disk_size, its own
    // directory): the node's capacities are split evenly.
    for (uint32_t i = 0; i < instances_; ++i) engines_.push_back({LruBytes(c.dram_bytes / instances_), LruBytes(c.ssd_bytes / instances_)});
    if (real_) buf_.assign(std::max<uint64_t>(real_file_bytes_, 1), 0x5a);
  }

  std::string_view name() const override { return layerwise_ ? "files-lw" : "files"; }
  // LocalDiskBackend.get_blocking, one chunk at a time; layer-wise, a layer's keys are one batch.
  bool serial_ssd_reads() const override { return !layerwise_; }
  bool layerwise() const override { return layerwise_; }
  bool ssd_layerwise() const override { return layerwise_; }  // per-layer objects

  LookupResult Lookup(const Request& req, uint32_t instance, double /*now*/) override {
    LookupResult r;
    inst_ = instance % instances_;
    LruBytes& hot = engines_[inst_].hot;
    LruBytes& disk = engines_[inst_].disk;
    if (real_) r.real_restore_s = 0;
    const size_t chunks = req.blocks.size() / blocks_per_chunk_;
    for (size_t c = 0; c < chunks; ++c) {
      const uint64_t key = req.blocks[(c + 1) * blocks_per_chunk_ - 1];
      if (hot.Contains(key)) {
        hot.Touch(key);
        r.dram_blocks += blocks_per_chunk_;
        r.dram_bytes_read += chunk_bytes_;
        r.dram_requests += layers_;
      } else if (disk.Contains(key)) {
        disk.Touch(key);
        if (real_) {
          auto t = ReadChunk(key);
          if (!t.ok()) {  // a failed read is a miss, never wrong bytes
            disk.Erase(key, chunk_bytes_);
            RemoveChunk(key);
            break;
          }
          r.real_restore_s += *t;
        }
        r.ssd_blocks += blocks_per_chunk_;
        // The whole file, exactly the chunk; per-layer files in whole pages.
        r.ssd_bytes_read += layerwise_ ? uint64_t{layers_} * files_per_chunk_ * layer_file_span_ : chunk_bytes_;
        r.ssd_bytes_useful += chunk_bytes_;
        r.ssd_requests += files_per_chunk_ * layers_;
        PutHot(key);  // StorageManager.get writes a disk hit back to the hot cache
        migrated_ += blocks_per_chunk_;
      } else {
        break;
      }
      r.hit_blocks += blocks_per_chunk_;
    }
    return r;
  }

  InsertResult Insert(const Request& req, uint32_t instance, uint32_t hit_blocks, double /*now*/) override {
    InsertResult w;
    inst_ = instance % instances_;
    LruBytes& hot = engines_[inst_].hot;
    LruBytes& disk = engines_[inst_].disk;
    if (real_) w.real_write_s = 0;
    const size_t chunks = req.blocks.size() / blocks_per_chunk_;
    for (size_t c = hit_blocks / blocks_per_chunk_; c < chunks; ++c) {
      const uint64_t key = req.blocks[(c + 1) * blocks_per_chunk_ - 1];
      if (hot.Contains(key) || disk.Contains(key)) continue;  // already stored
      if (PutHot(key)) w.dram_bytes_written += chunk_bytes_;
      std::vector<uint64_t> out;
      if (!disk.Put(key, chunk_bytes_, &out)) continue;
      for (uint64_t v : out) {
        if (real_) RemoveChunk(v);
        if (!hot.Contains(v)) evicted_ += blocks_per_chunk_;
      }
      if (real_) {
        auto t = WriteChunk(key);
        if (!t.ok()) {  // not stored on disk; the hot-cache copy stays
          disk.Erase(key, chunk_bytes_);
          RemoveChunk(key);
          continue;
        }
        w.real_write_s += *t;
      }
      w.ssd_bytes_written += chunk_bytes_;
      w.ssd_requests += files_per_chunk_ * layers_;
    }
    return w;
  }

  PolicyStats Stats() const override {
    PolicyStats s;
    for (const Engine& e : engines_) {
      s.dram_used_bytes += e.hot.used();
      s.ssd_used_bytes += e.disk.used();
    }
    s.evicted_blocks = evicted_;
    s.migrated_blocks = migrated_;
    return s;
  }

 private:
  bool PutHot(uint64_t key) {
    LruBytes& hot = engines_[inst_].hot;
    LruBytes& disk = engines_[inst_].disk;
    std::vector<uint64_t> out;
    if (!hot.Put(key, chunk_bytes_, &out)) return false;
    for (uint64_t v : out)
      if (!disk.Contains(v)) evicted_ += blocks_per_chunk_;
    return true;
  }

  std::string Path(uint64_t key, uint32_t part) const {
    return dir_ + "/" + std::to_string(inst_) + "-" + std::to_string(key) + "." + std::to_string(part) + ".chunk";
  }

  // Writes the chunk's files with write() + fsync; returns the seconds taken.
  Result<double> WriteChunk(uint64_t key) {
    const auto t0 = std::chrono::steady_clock::now();
    for (uint32_t p = 0; p < files_per_chunk_; ++p) {
      const std::string path = Path(key, p);
      const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) return Status::FromErrno(errno, "files: open " + path);
      uint64_t done = 0;
      while (done < real_file_bytes_) {
        const ssize_t n = ::write(fd, buf_.data() + done, real_file_bytes_ - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          const int err = n < 0 ? errno : EIO;
          ::close(fd);
          return Status::FromErrno(err, "files: write " + path);
        }
        done += static_cast<uint64_t>(n);
      }
      if (::fsync(fd) != 0) {
        const int err = errno;
        ::close(fd);
        return Status::FromErrno(err, "files: fsync " + path);
      }
      ::close(fd);
    }
    return Seconds(t0, std::chrono::steady_clock::now());
  }

  // Reads the chunk's files whole with buffered pread, after dropping their
  // cached pages; returns the seconds the reads took.
  Result<double> ReadChunk(uint64_t key) {
    double s = 0;
    for (uint32_t p = 0; p < files_per_chunk_; ++p) {
      const std::string path = Path(key, p);
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return Status::FromErrno(errno, "files: open " + path);
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      const auto t0 = std::chrono::steady_clock::now();
      uint64_t done = 0;
      while (done < real_file_bytes_) {
        const ssize_t n = ::pread(fd, buf_.data() + done, real_file_bytes_ - done, static_cast<off_t>(done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          const int err = n < 0 ? errno : EIO;
          ::close(fd);
          return Status::FromErrno(err, "files: pread " + path + " at " + std::to_string(done));
        }
        done += static_cast<uint64_t>(n);
      }
      s += Seconds(t0, std::chrono::steady_clock::now());
      ::close(fd);
    }
    return s;
  }

  void RemoveChunk(uint64_t key) {
    for (uint32_t p = 0; p < files_per_chunk_; ++p) ::unlink(Path(key, p).c_str());
  }

  const bool layerwise_;
  const uint32_t layers_;  // objects per chunk file: the model's layers (files-lw), else 1
  const uint32_t blocks_per_chunk_;
  const uint32_t files_per_chunk_;
  const uint64_t chunk_bytes_;
  // files-lw: one layer's file of one chunk part, rounded up to whole 4 KiB pages.
  const uint64_t layer_file_span_ = (chunk_bytes_ / files_per_chunk_ / layers_ + 4095) / 4096 * 4096;
  const bool real_;
  const std::string dir_;
  const uint64_t real_file_bytes_;
  struct Engine {
    LruBytes hot;   // LocalCPUBackend
    LruBytes disk;  // LocalDiskBackend
  };
  const uint32_t instances_;
  std::vector<Engine> engines_;  // one per serving instance
  uint32_t inst_ = 0;            // the engine of the call in progress
  std::vector<char> buf_;
  uint64_t evicted_ = 0;
  uint64_t migrated_ = 0;
};

}  // namespace

Result<std::unique_ptr<CachePolicy>> MakeFilesPolicy(const PolicyConfig& config, bool layerwise) {
  if (config.block_bytes == 0) return Status::InvalidArgument("files: block_bytes must be > 0");
  if (config.block_tokens == 0) return Status::InvalidArgument("files: block_tokens must be > 0");
  if (layerwise && config.layers == 0) return Status::InvalidArgument("files-lw: the model's layers are required");
  if (layerwise && config.io == IoMode::kReal)
    return Status::InvalidArgument("files-lw is modelled only (--io real runs files, whole chunks)");
  if (config.io == IoMode::kReal) {
    if (config.dir.empty()) return Status::InvalidArgument("files: kReal needs a scratch directory (config.dir)");
    if (!(config.scale >= 1.0))
      return Status::InvalidArgument("files: scale must be >= 1, got " + std::to_string(config.scale));
    if (::mkdir(config.dir.c_str(), 0755) != 0 && errno != EEXIST)
      return Status::FromErrno(errno, "files: mkdir " + config.dir);
  }
  return std::unique_ptr<CachePolicy>(new FilesPolicy(config, layerwise));
}

}  // namespace flatkv::replay
