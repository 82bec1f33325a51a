// The two ceilings of `flatkv bench restore`: memcpy from DRAM and a raw
// O_DIRECT read of one file (what fio measures). Also VerifyDestination.
#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "bench/bench_runs.h"
#include "common/mutex.h"

namespace flatkv::tools {
namespace {

// The DRAM ceiling: the session copied by `threads` threads, each a
// contiguous share (the caller's thread takes the first). The other threads
// are started at Setup and woken per run, as the store's DramQueue workers
// are, so thread creation is not timed on either side.
class MemcpyRun final : public RestoreRun {
 public:
  explicit MemcpyRun(uint32_t threads) : threads_(std::max<uint32_t>(1, threads)) {}
  ~MemcpyRun() override { (void)Teardown(); }

  std::string_view name() const override { return "memcpy"; }
  Status Setup(const BenchSession& session) override {
    src_ = session.bytes;
    {
      MutexLock lock(&mu_);
      stop_ = false;
    }
    for (uint32_t t = 1; t < threads_; ++t) helpers_.emplace_back([this, t] { Help(t); });
    return Status::Ok();
  }
  Result<double> Run(std::span<std::byte> dst) override {
    const double t0 = NowSeconds();
    {
      MutexLock lock(&mu_);
      dst_ = dst.data();
      pending_ = threads_ - 1;
      ++round_;
    }
    wake_.SignalAll();
    CopyShare(dst.data(), 0);
    {
      MutexLock lock(&mu_);
      while (pending_ != 0) done_.Wait(&mu_);
    }
    return NowSeconds() - t0;
  }
  Status Teardown() override {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    wake_.SignalAll();
    for (auto& t : helpers_) t.join();
    helpers_.clear();
    return Status::Ok();
  }
  nlohmann::json Describe() const override { return {{"threads", threads_}, {"source", "pre-faulted DRAM buffer"}}; }

 private:
  void CopyShare(std::byte* dst, uint32_t t) {
    // Shares in whole 4 KiB pages, so two threads never write one page.
    const uint64_t pages = (src_.size() + 4095) / 4096;
    const uint64_t begin = std::min<uint64_t>(src_.size(), pages * t / threads_ * 4096);
    const uint64_t end = std::min<uint64_t>(src_.size(), pages * (t + 1) / threads_ * 4096);
    if (end > begin) std::memcpy(dst + begin, src_.data() + begin, end - begin);
  }
  void Help(uint32_t t) {
    uint64_t seen = 0;
    for (;;) {
      std::byte* dst;
      {
        MutexLock lock(&mu_);
        while (!stop_ && round_ == seen) wake_.Wait(&mu_);
        if (stop_) return;
        seen = round_;
        dst = dst_;
      }
      CopyShare(dst, t);
      MutexLock lock(&mu_);
      if (--pending_ == 0) done_.Signal();
    }
  }

  const uint32_t threads_;
  std::span<const std::byte> src_;
  std::vector<std::thread> helpers_;
  Mutex mu_;
  CondVar wake_, done_;
  std::byte* dst_ FLATKV_GUARDED_BY(mu_) = nullptr;
  uint64_t round_ FLATKV_GUARDED_BY(mu_) = 0;
  uint32_t pending_ FLATKV_GUARDED_BY(mu_) = 0;
  bool stop_ FLATKV_GUARDED_BY(mu_) = false;
};

// Writes `len` bytes from `buf` at `offset`, retrying short writes.
Status WriteFull(int fd, const std::byte* buf, uint64_t len, uint64_t offset, const std::string& what) {
  while (len > 0) {
    const ssize_t n = ::pwrite(fd, buf, len, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "pwrite " + what + " at " + std::to_string(offset));
    }
    buf += n;
    len -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

class RawDirectReadRun final : public RestoreRun {
 public:
  RawDirectReadRun(uint64_t request_bytes, uint32_t queue_depth)
      : request_bytes_(request_bytes), queue_depth_(queue_depth) {}
  ~RawDirectReadRun() override { (void)Teardown(); }

  std::string_view name() const override { return "raw_direct_read"; }

  Status Setup(const BenchSession& session) override {
    path_ = session.dir + "/raw_session.bin";
    bytes_ = session.padded_bytes;
    {
      const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
      if (fd < 0) {
        return Status::FromErrno(errno, "raw_direct_read: open " + path_ + " with O_DIRECT (the filesystem may refuse it)");
      }
      // The source buffer holds padded_bytes (see BenchSession), so one
      // aligned write covers the session and its padding.
      Status st = WriteFull(fd, session.bytes.data(), bytes_, 0, path_);
      if (st.ok() && ::fdatasync(fd) != 0) st = Status::FromErrno(errno, "fdatasync " + path_);
      ::close(fd);
      FLATKV_RETURN_IF_ERROR(st);
    }
    fd_ = ::open(path_.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd_ < 0) return Status::FromErrno(errno, "raw_direct_read: open " + path_ + " O_RDONLY|O_DIRECT");
    const int rc = ::io_uring_queue_init(queue_depth_, &ring_, 0);
    if (rc < 0) return Status::FromErrno(-rc, "raw_direct_read: io_uring_queue_init");
    ring_open_ = true;
    return Status::Ok();
  }

  Result<double> Run(std::span<std::byte> dst) override {
    if (dst.size() < bytes_) return Status::InvalidArgument("raw_direct_read: destination too small");
    const double t0 = NowSeconds();
    uint64_t next = 0;       // next offset to submit
    uint64_t done = 0;       // bytes completed
    uint32_t in_flight = 0;
    while (done < bytes_) {
      while (in_flight < queue_depth_ && next < bytes_) {
        io_uring_sqe* sqe = ::io_uring_get_sqe(&ring_);
        if (sqe == nullptr) break;
        const uint64_t len = std::min(request_bytes_, bytes_ - next);
        ::io_uring_prep_read(sqe, fd_, dst.data() + next, static_cast<unsigned>(len), next);
        ::io_uring_sqe_set_data64(sqe, len);
        next += len;
        ++in_flight;
      }
      int rc = ::io_uring_submit_and_wait(&ring_, 1);
      if (rc < 0 && rc != -EINTR) return Status::FromErrno(-rc, "raw_direct_read: io_uring_submit_and_wait");
      io_uring_cqe* cqe = nullptr;
      while (::io_uring_peek_cqe(&ring_, &cqe) == 0) {
        const int64_t res = cqe->res;
        const uint64_t want = ::io_uring_cqe_get_data64(cqe);
        ::io_uring_cqe_seen(&ring_, cqe);
        --in_flight;
        if (res < 0) return Status::FromErrno(static_cast<int>(-res), "raw_direct_read: read of " + path_);
        if (static_cast<uint64_t>(res) != want) {
          return Status::IoError("raw_direct_read: short read of " + path_ + ": " + std::to_string(res) + " of " +
                                 std::to_string(want) + " bytes");
        }
        done += want;
      }
    }
    return NowSeconds() - t0;
  }

  Status Teardown() override {
    if (ring_open_) ::io_uring_queue_exit(&ring_);
    ring_open_ = false;
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (!path_.empty()) ::unlink(path_.c_str());
    path_.clear();
    return Status::Ok();
  }

  nlohmann::json Describe() const override {
    return {{"engine", "io_uring"}, {"o_direct", true}, {"request_bytes", request_bytes_}, {"queue_depth", queue_depth_}};
  }

 private:
  const uint64_t request_bytes_;
  const uint32_t queue_depth_;
  std::string path_;
  uint64_t bytes_ = 0;
  int fd_ = -1;
  io_uring ring_{};
  bool ring_open_ = false;
};

}  // namespace

Status VerifyDestination(const BenchSession& s, DestLayout layout, std::span<const std::byte> dst) {
  const uint64_t total = s.bytes.size();
  if (dst.size() < total) return Status::InvalidArgument("destination smaller than the session");
  if (layout == DestLayout::kBlockMajor) {
    if (std::memcmp(dst.data(), s.bytes.data(), total) == 0) return Status::Ok();
    for (uint32_t b = 0; b < s.blocks; ++b) {
      for (uint32_t l = 0; l < s.shape.layers; ++l) {
        const uint64_t off = b * s.block_bytes + l * s.block_layer_bytes;
        if (std::memcmp(dst.data() + off, s.bytes.data() + off, s.block_layer_bytes) != 0) {
          return Status::Corruption("block " + std::to_string(b) + " layer " + std::to_string(l) + " differs");
        }
      }
    }
    return Status::Corruption("destination differs from the session");
  }
  for (uint32_t l = 0; l < s.shape.layers; ++l) {
    for (uint32_t b = 0; b < s.blocks; ++b) {
      const uint64_t want = b * s.block_bytes + l * s.block_layer_bytes;
      const uint64_t got = (uint64_t{l} * s.blocks + b) * s.block_layer_bytes;
      if (std::memcmp(dst.data() + got, s.bytes.data() + want, s.block_layer_bytes) != 0) {
        return Status::Corruption("block " + std::to_string(b) + " layer " + std::to_string(l) + " differs");
      }
    }
  }
  return Status::Ok();
}

std::unique_ptr<RestoreRun> MakeMemcpyRun(uint32_t threads) { return std::make_unique<MemcpyRun>(threads); }

std::unique_ptr<RestoreRun> MakeRawDirectReadRun(uint64_t request_bytes, uint32_t queue_depth) {
  return std::make_unique<RawDirectReadRun>(request_bytes, queue_depth);
}

}  // namespace flatkv::tools
