// The peer layouts of `flatkv bench restore`, each configured as its users
// run it (the sources are cited in docs/benchmarks.md):
//   files_per_block: one file per block, as LMCache's local-disk backend and
//     SGLang HiCache's file backend store KV: written with write()+fsync,
//     read back with a buffered pread of the whole file, by 4 worker
//     threads (LMCache's LocalDiskWorker: AsyncPQThreadPoolExecutor with
//     max_workers=4), each taking the next block.
//   rocksdb: RocksDB with the options a user would start from, one value
//     per block under its 16-byte key, read with one Get per block.
//   rocksdb_blobdb: RocksDB as a large-value store is run: integrated
//     BlobDB (values in blob files, keys and blob references in the LSM
//     tree), direct reads, and one MultiGet for the session's blocks.
// Both RocksDB runs are kept: on the machines measured so far the BlobDB
// one is the slower (docs/benchmarks.md), and flat is compared with the
// faster. files_per_block and rocksdb read through the page cache, so
// Prepare evicts their files first.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>
#include <rocksdb/version.h>

#include "bench/bench_runs.h"

namespace flatkv::tools {
namespace {

// Writes all of `data` to a new file `path`, then fsyncs it.
Status WriteFileSynced(const std::string& path, std::span<const std::byte> data) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno(errno, "open " + path);
  const std::byte* p = data.data();
  size_t left = data.size();
  Status st;
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      st = Status::FromErrno(errno, "write " + path);
      break;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (st.ok() && ::fsync(fd) != 0) st = Status::FromErrno(errno, "fsync " + path);
  ::close(fd);
  return st;
}

// A fixed set of worker threads, started once, that run fn(i) for each i
// of a job: each worker takes the next index until none is left, as a
// thread-pool executor fed one task per block does.
class WorkerPool {
 public:
  explicit WorkerPool(uint32_t threads) {
    for (uint32_t t = 0; t < threads; ++t) threads_.emplace_back([this] { Work(); });
  }
  ~WorkerPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }
  uint32_t size() const { return static_cast<uint32_t>(threads_.size()); }

  // Runs fn(0) .. fn(count - 1) on the workers; returns the first error.
  Status ForEach(size_t count, std::function<Status(size_t)> fn) {
    std::unique_lock<std::mutex> lock(mu_);
    fn_ = std::move(fn);
    count_ = count;
    next_ = 0;
    busy_ = size();
    first_error_ = Status::Ok();
    ++generation_;
    wake_.notify_all();
    done_.wait(lock, [this] { return busy_ == 0; });
    fn_ = nullptr;
    return first_error_;
  }

 private:
  void Work() {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      while (next_ < count_) {
        const size_t i = next_++;
        lock.unlock();
        Status s = fn_(i);
        lock.lock();
        if (!s.ok() && first_error_.ok()) first_error_ = std::move(s);
      }
      if (--busy_ == 0) done_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::function<Status(size_t)> fn_;
  size_t count_ = 0, next_ = 0;
  uint32_t busy_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  Status first_error_;
  std::vector<std::thread> threads_;
};

// open + buffered pread of all `bytes` of `path` into `out` + close.
Status ReadWholeFile(const std::string& path, std::byte* out, uint64_t bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "files_per_block: open " + path);
  uint64_t got = 0;
  while (got < bytes) {
    const ssize_t n = ::pread(fd, out + got, bytes - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      ::close(fd);
      if (err != 0) return Status::FromErrno(err, "files_per_block: pread " + path);
      return Status::IoError("files_per_block: " + path + " is short: " + std::to_string(got) + " bytes");
    }
    got += static_cast<uint64_t>(n);
  }
  ::close(fd);
  return Status::Ok();
}

// LMCache's local-disk worker pool size (local_disk_backend.py, LocalDiskWorker).
constexpr uint32_t kLmcacheDiskWorkers = 4;

class FilesPerBlockRun final : public RestoreRun {
 public:
  explicit FilesPerBlockRun(const PageCacheEvictor* evictor) : evictor_(evictor) {}
  ~FilesPerBlockRun() override { (void)Teardown(); }

  std::string_view name() const override { return "files_per_block"; }

  Status Setup(const BenchSession& s) override {
    session_ = &s;
    dir_ = s.dir + "/files_per_block";
    if (::mkdir(dir_.c_str(), 0755) != 0) return Status::FromErrno(errno, "mkdir " + dir_);
    paths_.clear();
    for (uint32_t b = 0; b < s.blocks; ++b) {
      paths_.push_back(dir_ + "/" + s.keys[b].ToHex() + ".kv");
      FLATKV_RETURN_IF_ERROR(WriteFileSynced(paths_.back(), s.bytes.subspan(b * s.block_bytes, s.block_bytes)));
    }
    return Status::Ok();
  }

  Status Prepare() override { return evictor_->Evict({dir_}); }

  Result<double> Run(std::span<std::byte> dst) override {
    const uint64_t bb = session_->block_bytes;
    const double t0 = NowSeconds();
    FLATKV_RETURN_IF_ERROR(
        workers_.ForEach(paths_.size(), [&](size_t b) { return ReadWholeFile(paths_[b], dst.data() + b * bb, bb); }));
    return NowSeconds() - t0;
  }

  Status Teardown() override {
    paths_.clear();
    if (dir_.empty()) return Status::Ok();
    Status st = RemoveAll(dir_);
    dir_.clear();
    return st;
  }

  std::vector<std::string> CachedFiles() const override { return {dir_}; }

  nlohmann::json Describe() const override {
    return {{"files", paths_.size()},
            {"write", "write()+fsync per file"},
            {"read", "open + buffered pread of the whole file + close, each block a task"},
            {"worker_threads", workers_.size()},
            {"page_cache_eviction", evictor_->method()}};
  }

 private:
  const PageCacheEvictor* evictor_;
  const BenchSession* session_ = nullptr;
  std::string dir_;
  std::vector<std::string> paths_;
  WorkerPool workers_{kLmcacheDiskWorkers};
};

std::string KeyBytes(const BlockKey& k) {
  std::string s(16, '\0');
  for (int i = 0; i < 8; ++i) {
    s[i] = static_cast<char>(k.lo >> (8 * i));
    s[8 + i] = static_cast<char>(k.hi >> (8 * i));
  }
  return s;
}

Status FromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return Status::Ok();
  return Status::IoError("rocksdb: " + what + ": " + s.ToString());
}

std::string CompressionName(rocksdb::CompressionType c) {
  switch (c) {
    case rocksdb::kNoCompression: return "none";
    case rocksdb::kSnappyCompression: return "snappy";
    case rocksdb::kZlibCompression: return "zlib";
    case rocksdb::kLZ4Compression: return "lz4";
    case rocksdb::kZSTD: return "zstd";
    default: return "type " + std::to_string(int(c));
  }
}

class RocksDbRun final : public RestoreRun {
 public:
  RocksDbRun(const PageCacheEvictor* evictor, RocksDbConfig config) : evictor_(evictor), config_(config) {}
  ~RocksDbRun() override { (void)Teardown(); }

  std::string_view name() const override { return blobdb() ? "rocksdb_blobdb" : "rocksdb"; }

  Status Setup(const BenchSession& s) override {
    session_ = &s;
    path_ = s.dir + "/" + std::string(name());
    options_ = rocksdb::Options();
    options_.create_if_missing = true;
    // kDefaults: the default write_buffer_size (64 MiB) already holds
    // several 8 MiB values; keep it.
    if (blobdb()) {
      // Integrated BlobDB, as RocksDB's wiki advises for large values:
      // every value (min_blob_size 0; blocks are MiBs) goes to blob files of
      // the default 256 MiB, the LSM tree keeps keys and blob references.
      options_.enable_blob_files = true;
      options_.min_blob_size = 0;
      options_.enable_blob_garbage_collection = true;
      // Direct I/O for reads and for flush/compaction writes (the wiki's
      // Direct IO page); no blob cache is configured.
      options_.use_direct_reads = true;
      options_.use_direct_io_for_flush_and_compaction = true;
    }
    // No block cache, so no user-space cache hides the disk; the OS page
    // cache is evicted in Prepare.
    rocksdb::BlockBasedTableOptions table;
    table.no_block_cache = true;
    options_.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
    rocksdb::DB* db = nullptr;
    FLATKV_RETURN_IF_ERROR(FromRocks(rocksdb::DB::Open(options_, path_, &db), "open " + path_));
    db_.reset(db);
    keys_.clear();
    for (uint32_t b = 0; b < s.blocks; ++b) {
      keys_.push_back(KeyBytes(s.keys[b]));
      const auto* v = reinterpret_cast<const char*>(s.bytes.data() + b * s.block_bytes);
      FLATKV_RETURN_IF_ERROR(FromRocks(db_->Put(rocksdb::WriteOptions(), keys_.back(), rocksdb::Slice(v, s.block_bytes)),
                                       "put block " + std::to_string(b)));
    }
    slices_.assign(keys_.begin(), keys_.end());
    FLATKV_RETURN_IF_ERROR(FromRocks(db_->Flush(rocksdb::FlushOptions()), "flush"));
    return WaitForBackgroundWork();
  }

  Status Prepare() override { return evictor_->Evict({path_}); }

  Result<double> Run(std::span<std::byte> dst) override { return blobdb() ? RunMultiGet(dst) : RunGets(dst); }

  Status Teardown() override {
    if (db_ != nullptr) {
      (void)db_->Close();
      db_.reset();
    }
    if (path_.empty()) return Status::Ok();
    Status st = RemoveAll(path_);
    path_.clear();
    return st;
  }

  std::vector<std::string> CachedFiles() const override { return {path_}; }

  nlohmann::json Describe() const override {
    nlohmann::json j = {{"version", std::to_string(ROCKSDB_MAJOR) + "." + std::to_string(ROCKSDB_MINOR) + "." +
                                        std::to_string(ROCKSDB_PATCH)},
                        {"options", blobdb() ? "create_if_missing, integrated BlobDB, direct reads and flush/compaction "
                                               "I/O; no block or blob cache"
                                             : "defaults + create_if_missing; block cache disabled"},
                        {"enable_blob_files", options_.enable_blob_files},
                        {"use_direct_reads", options_.use_direct_reads},
                        {"write_buffer_size", options_.write_buffer_size},
                        {"compression", CompressionName(options_.compression)},
                        {"read", blobdb() ? "one MultiGet of every block into PinnableSlices, then memcpy"
                                          : "Get into PinnableSlice, then memcpy, one block at a time"},
                        {"page_cache_eviction", evictor_->method()}};
    if (blobdb()) {
      j["min_blob_size"] = options_.min_blob_size;
      j["blob_file_size"] = options_.blob_file_size;
      j["blob_compression"] = CompressionName(options_.blob_compression_type);
    }
    if (db_ != nullptr) {
      std::string levels;
      if (db_->GetProperty("rocksdb.levelstats", &levels)) j["levelstats"] = levels;
    }
    return j;
  }

 private:
  bool blobdb() const { return config_ == RocksDbConfig::kBlobDb; }

  Status CheckSize(size_t b, const rocksdb::PinnableSlice& value) const {
    if (value.size() == session_->block_bytes) return Status::Ok();
    return Status::Corruption("rocksdb: block " + std::to_string(b) + " has " + std::to_string(value.size()) +
                              " bytes, expected " + std::to_string(session_->block_bytes));
  }

  // One Get per block into one reused PinnableSlice, then memcpy.
  Result<double> RunGets(std::span<std::byte> dst) {
    const uint64_t bb = session_->block_bytes;
    rocksdb::ReadOptions ro;
    ro.fill_cache = false;
    rocksdb::PinnableSlice value;
    const double t0 = NowSeconds();
    for (size_t b = 0; b < slices_.size(); ++b) {
      value.Reset();
      rocksdb::Status s = db_->Get(ro, db_->DefaultColumnFamily(), slices_[b], &value);
      if (!s.ok()) return FromRocks(s, "get block " + std::to_string(b));
      FLATKV_RETURN_IF_ERROR(CheckSize(b, value));
      std::memcpy(dst.data() + b * bb, value.data(), bb);
    }
    value.Reset();
    return NowSeconds() - t0;
  }

  // One batched MultiGet for the session (the wiki's MultiGet Performance
  // page: RocksDB groups the lookups and the blob reads), then memcpy.
  Result<double> RunMultiGet(std::span<std::byte> dst) {
    const uint64_t bb = session_->block_bytes;
    rocksdb::ReadOptions ro;
    ro.fill_cache = false;
    const size_t n = slices_.size();
    std::vector<rocksdb::PinnableSlice> values(n);
    std::vector<rocksdb::Status> statuses(n);
    const double t0 = NowSeconds();
    db_->MultiGet(ro, db_->DefaultColumnFamily(), n, slices_.data(), values.data(), statuses.data());
    for (size_t b = 0; b < n; ++b) {
      if (!statuses[b].ok()) return FromRocks(statuses[b], "multiget block " + std::to_string(b));
      FLATKV_RETURN_IF_ERROR(CheckSize(b, values[b]));
      std::memcpy(dst.data() + b * bb, values[b].data(), bb);
    }
    return NowSeconds() - t0;
  }

  // Waits until no flush or compaction is pending or running, so reads are
  // timed against a settled LSM tree with no background I/O.
  Status WaitForBackgroundWork() {
    for (int i = 0; i < 6000; ++i) {
      uint64_t pending = 0, compactions = 0, flushes = 0;
      db_->GetIntProperty("rocksdb.compaction-pending", &pending);
      db_->GetIntProperty("rocksdb.num-running-compactions", &compactions);
      db_->GetIntProperty("rocksdb.num-running-flushes", &flushes);
      if (pending == 0 && compactions == 0 && flushes == 0) return Status::Ok();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return Status::Aborted("rocksdb: background compaction still running after 120 s");
  }

  const PageCacheEvictor* evictor_;
  const RocksDbConfig config_;
  const BenchSession* session_ = nullptr;
  std::string path_;
  rocksdb::Options options_;
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<std::string> keys_;
  std::vector<rocksdb::Slice> slices_;  // keys_, as MultiGet takes them
};

}  // namespace

std::unique_ptr<RestoreRun> MakeFilesPerBlockRun(const PageCacheEvictor* evictor) {
  return std::make_unique<FilesPerBlockRun>(evictor);
}

std::unique_ptr<RestoreRun> MakeRocksDbRun(const PageCacheEvictor* evictor, RocksDbConfig config) {
  return std::make_unique<RocksDbRun>(evictor, config);
}

}  // namespace flatkv::tools
