// The peer layouts of `flatkv bench restore`:
//   files_per_block: one file per block, as LMCache's local-disk backend and
//     SGLang HiCache's file backend store KV: written with write()+fsync,
//     read back with a buffered pread of the whole file.
//   rocksdb: RocksDB with the options a user would start from, one value
//     per block under its 16-byte key, read with Get.
// Both read through the page cache, so Prepare evicts their files first.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>
#include <rocksdb/version.h>

#include "tools/bench_runs.h"

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
    for (size_t b = 0; b < paths_.size(); ++b) {
      const int fd = ::open(paths_[b].c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return Status::FromErrno(errno, "files_per_block: open " + paths_[b]);
      std::byte* out = dst.data() + b * bb;
      uint64_t got = 0;
      while (got < bb) {
        const ssize_t n = ::pread(fd, out + got, bb - got, static_cast<off_t>(got));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          const int err = n < 0 ? errno : 0;
          ::close(fd);
          if (err != 0) return Status::FromErrno(err, "files_per_block: pread " + paths_[b]);
          return Status::IoError("files_per_block: " + paths_[b] + " is short: " + std::to_string(got) + " bytes");
        }
        got += static_cast<uint64_t>(n);
      }
      ::close(fd);
    }
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
            {"read", "open + buffered pread of the whole file + close, one file at a time"},
            {"page_cache_eviction", evictor_->method()}};
  }

 private:
  const PageCacheEvictor* evictor_;
  const BenchSession* session_ = nullptr;
  std::string dir_;
  std::vector<std::string> paths_;
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
  explicit RocksDbRun(const PageCacheEvictor* evictor) : evictor_(evictor) {}
  ~RocksDbRun() override { (void)Teardown(); }

  std::string_view name() const override { return "rocksdb"; }

  Status Setup(const BenchSession& s) override {
    session_ = &s;
    path_ = s.dir + "/rocksdb";
    options_ = rocksdb::Options();
    options_.create_if_missing = true;
    // The default write_buffer_size (64 MiB) already holds several 8 MiB
    // values; keep it. No block cache, so no user-space cache hides the
    // disk; the OS page cache is evicted in Prepare.
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
    FLATKV_RETURN_IF_ERROR(FromRocks(db_->Flush(rocksdb::FlushOptions()), "flush"));
    return WaitForBackgroundWork();
  }

  Status Prepare() override { return evictor_->Evict({path_}); }

  Result<double> Run(std::span<std::byte> dst) override {
    const uint64_t bb = session_->block_bytes;
    rocksdb::ReadOptions ro;
    ro.fill_cache = false;
    rocksdb::PinnableSlice value;
    const double t0 = NowSeconds();
    for (size_t b = 0; b < keys_.size(); ++b) {
      value.Reset();
      rocksdb::Status s = db_->Get(ro, db_->DefaultColumnFamily(), keys_[b], &value);
      if (!s.ok()) return FromRocks(s, "get block " + std::to_string(b));
      if (value.size() != bb) {
        return Status::Corruption("rocksdb: block " + std::to_string(b) + " has " + std::to_string(value.size()) +
                                  " bytes, expected " + std::to_string(bb));
      }
      std::memcpy(dst.data() + b * bb, value.data(), bb);
    }
    value.Reset();
    return NowSeconds() - t0;
  }

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
                        {"options", "defaults + create_if_missing; block cache disabled"},
                        {"write_buffer_size", options_.write_buffer_size},
                        {"compression", CompressionName(options_.compression)},
                        {"read", "Get into PinnableSlice, then memcpy"},
                        {"page_cache_eviction", evictor_->method()}};
    if (db_ != nullptr) {
      std::string levels;
      if (db_->GetProperty("rocksdb.levelstats", &levels)) j["levelstats"] = levels;
    }
    return j;
  }

 private:
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
  const BenchSession* session_ = nullptr;
  std::string path_;
  rocksdb::Options options_;
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<std::string> keys_;
};

}  // namespace

std::unique_ptr<RestoreRun> MakeFilesPerBlockRun(const PageCacheEvictor* evictor) {
  return std::make_unique<FilesPerBlockRun>(evictor);
}

std::unique_ptr<RestoreRun> MakeRocksDbRun(const PageCacheEvictor* evictor) {
  return std::make_unique<RocksDbRun>(evictor);
}

}  // namespace flatkv::tools
