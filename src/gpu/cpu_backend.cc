// CpuCopyBackend: the copy backend's contract on host memory, one worker
// thread as the in-order queue, events as sequence numbers. Its "device"
// memory is mapped PROT_NONE outside the backend's own operations, as a
// GPU's is out of the host's reach: a restore that wrote a device
// destination itself, not through a copy, faults in the tests. With file
// reads it preads files into that memory on reader threads of its own, as
// the CUDA backend's cuFile reads do ("cpu-pread"), and checksums slices
// there, so the restore's device-read path runs in CI.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "common/mutex.h"
#include "gpu/copy_backend.h"
#include "store/dram_queue.h"

namespace flatkv::gpu {
namespace {

class CpuCopyBackend final : public CopyBackend {
 public:
  explicit CpuCopyBackend(const CpuBackendOptions& o)
      : fail_after_(o.fail_after),
        file_reads_(o.file_reads),
        fail_reads_(o.fail_reads),
        decodes_(o.decodes),
        fail_decodes_(o.fail_decodes),
        queue_delay_(o.queue_delay_us),
        worker_([this] { Run(); }) {}
  ~CpuCopyBackend() override {
    readers_.reset();  // runs the reads queued, then joins
    {
      MutexLock lock(&mu_);
      stop_ = true;
      cv_.SignalAll();
    }
    worker_.join();
  }
  std::string name() const override { return "cpu"; }

  std::byte* AllocateDevice(uint64_t bytes) override {
    const uint64_t len = RoundUp(std::max<uint64_t>(bytes, 1));
    void* p = ::mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    std::lock_guard<std::mutex> lock(device_mu_);
    device_[static_cast<std::byte*>(p)] = len;
    return static_cast<std::byte*>(p);
  }
  void FreeDevice(std::byte* p) override {
    std::lock_guard<std::mutex> lock(device_mu_);
    auto it = device_.find(p);
    if (it == device_.end()) return;
    ::munmap(p, it->second);
    device_.erase(it);
  }
  Status RegisterHost(const std::byte* p, uint64_t bytes) override {
    MutexLock lock(&mu_);
    stats_.registered_bytes += bytes;
    return Status::Ok();
  }
  void UnregisterHost(const std::byte* p) override {}

  Status EnqueueCopy(std::byte* dst, const std::byte* src, uint64_t bytes) override {
    return Enqueue([this, dst, src, bytes]() -> Status {
      {
        MutexLock lock(&mu_);
        if (fail_after_ > 0 && ++copies_ >= fail_after_)
          return Status::IoError("cpu copy backend: copy " + std::to_string(copies_) + " failed (injected)");
      }
      {
        DeviceAccess access(this, {{dst, bytes}});
        std::memcpy(dst, src, bytes);
      }
      MutexLock lock(&mu_);
      stats_.h2d_bytes += bytes;
      stats_.h2d_copies++;
      return Status::Ok();
    });
  }
  Status EnqueueScatter(const std::byte* slot, std::span<const PageCopy> pages) override {
    std::vector<PageCopy> copy(pages.begin(), pages.end());
    return Enqueue([this, slot, copy = std::move(copy)]() -> Status {
      for (const PageCopy& p : copy) {
        DeviceAccess access(this, {{slot + p.src, p.bytes}, {p.dst, p.bytes}});
        std::memcpy(p.dst, slot + p.src, p.bytes);
      }
      MutexLock lock(&mu_);
      stats_.scatter_pages += copy.size();
      return Status::Ok();
    });
  }
  uint64_t Record() override {
    MutexLock lock(&mu_);
    return enqueued_;  // passed once every op queued so far ran
  }
  Status Wait(uint64_t event) override {
    MutexLock lock(&mu_);
    while (done_ < event) cv_.Wait(&mu_);
    return FirstFailureUpTo(event);
  }
  bool Done(uint64_t event) override {
    MutexLock lock(&mu_);
    return done_ >= event;
  }
  Status CopyToHost(std::byte* dst, const std::byte* src, uint64_t bytes) override {
    FLATKV_RETURN_IF_ERROR(Wait(Record()));
    DeviceAccess access(this, {{src, bytes}});
    std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
  CopyBackendStats Stats() const override {
    MutexLock lock(&mu_);
    return stats_;
  }

  std::string file_read_path() const override { return file_reads_ ? "cpu-pread" : ""; }
  std::string no_file_reads_why() const override {
    return file_reads_ ? "" : "the cpu copy backend was made without file reads";
  }
  Status RegisterFile(int fd) override {
    if (!file_reads_) return Status::FailedPrecondition("cpu copy backend: " + no_file_reads_why());
    struct stat st;
    if (::fstat(fd, &st) != 0) return Status::FromErrno(errno, "cpu copy backend: fstat of fd " + std::to_string(fd));
    MutexLock lock(&mu_);
    if (files_.insert({st.st_dev, st.st_ino}).second) stats_.registered_files++;
    return Status::Ok();
  }
  void SubmitRead(int fd, uint64_t offset, std::byte* dst, uint64_t bytes, std::function<void(Status)> done) override {
    if (!file_reads_) return done(Status::FailedPrecondition("cpu copy backend: " + no_file_reads_why()));
    {
      MutexLock lock(&mu_);
      if (!readers_) readers_ = std::make_unique<DramQueue>(kReaders);
    }
    readers_->Submit([this, fd, offset, dst, bytes, done = std::move(done)] {
      Status s;
      {
        MutexLock lock(&mu_);
        if (fail_reads_ > 0 && ++reads_ >= fail_reads_)
          s = Status::IoError("cpu copy backend: read " + std::to_string(reads_) + " failed (injected)");
      }
      if (s.ok()) {
        DeviceAccess access(this, {{dst, bytes}});
        for (uint64_t got = 0; got < bytes && s.ok();) {
          const ssize_t n = ::pread(fd, dst + got, bytes - got, static_cast<off_t>(offset + got));
          if (n < 0 && errno == EINTR) continue;
          if (n < 0) s = Status::FromErrno(errno, "cpu copy backend: pread at offset " + std::to_string(offset + got));
          else if (n == 0) s = Status::IoError("cpu copy backend: end of file at offset " + std::to_string(offset + got));
          else got += static_cast<uint64_t>(n);
        }
      }
      {
        MutexLock lock(&mu_);
        CountFileRead(stats_, s.ok(), bytes);
      }
      done(std::move(s));
    });
  }
  Status Checksums(const std::byte* slices, uint32_t n, uint64_t bytes, uint64_t* out) override {
    DeviceAccess access(this, {{slices, uint64_t{n} * bytes}});
    for (uint32_t j = 0; j < n; ++j) out[j] = BlockChecksum(slices + uint64_t{j} * bytes, bytes);
    return Status::Ok();
  }

  // The codecs the CUDA backend decodes (int8, kivi), with the CPU codec.
  bool DecodesCodec(const Codec& codec, const SliceLayout& layout) const override {
    const DType dt = layout.shape.dtype;
    return decodes_ && (codec.id() == 1 || codec.id() == 2) && (dt == DType::kF32 || dt == DType::kF16 || dt == DType::kBF16);
  }
  Status DecodeSlices(const SliceLayout& layout, std::span<const std::span<const std::byte>> slices,
                      std::span<std::byte* const> dst) override {
    if (!decodes_) return Status::FailedPrecondition("cpu copy backend: made without decoders");
    {
      MutexLock lock(&mu_);
      if (fail_decodes_ > 0 && ++decode_calls_ >= fail_decodes_)
        return Status::IoError("cpu copy backend: decode " + std::to_string(decode_calls_) + " failed (injected)");
    }
    thread_local CodecContext ctx;
    std::vector<std::byte> out(layout.Bytes());
    uint64_t in_bytes = 0;
    for (size_t j = 0; j < slices.size(); ++j) {
      FLATKV_RETURN_IF_ERROR(DecodeSlice(ctx, layout, slices[j], out));
      DeviceAccess access(this, {{dst[j], out.size()}});
      std::memcpy(dst[j], out.data(), out.size());
      in_bytes += slices[j].size();
    }
    MutexLock lock(&mu_);
    stats_.decoded_slices += slices.size();
    stats_.decode_in_bytes += in_bytes;
    return Status::Ok();
  }

 private:
  static constexpr uint32_t kReaders = 4;
  static uint64_t RoundUp(uint64_t n) { return (n + 4095) / 4096 * 4096; }
  // Opens the device pages under the given ranges for one operation (one
  // at a time), closing them again after it; host ranges are left alone.
  class DeviceAccess {
   public:
    DeviceAccess(CpuCopyBackend* b, std::initializer_list<std::pair<const std::byte*, uint64_t>> ranges)
        : lock_(b->device_mu_) {
      for (const auto& [p, n] : ranges)
        if (n > 0 && b->OnDevice(p)) open_.push_back(Pages(p, n));
      for (const auto& [p, n] : open_) ::mprotect(p, n, PROT_READ | PROT_WRITE);
    }
    ~DeviceAccess() {
      for (const auto& [p, n] : open_) ::mprotect(p, n, PROT_NONE);
    }

   private:
    static std::pair<void*, uint64_t> Pages(const std::byte* p, uint64_t n) {
      const uintptr_t a = reinterpret_cast<uintptr_t>(p) / 4096 * 4096;
      return {reinterpret_cast<void*>(a), RoundUp(reinterpret_cast<uintptr_t>(p) + n - a)};
    }
    std::lock_guard<std::mutex> lock_;
    std::vector<std::pair<void*, uint64_t>> open_;
  };
  bool OnDevice(const std::byte* p) const {  // with device_mu_ held
    auto it = device_.upper_bound(p);
    if (it == device_.begin()) return false;
    --it;
    return p < it->first + it->second;
  }
  Status Enqueue(std::function<Status()> op) {
    MutexLock lock(&mu_);
    if (stop_) return Status::FailedPrecondition("cpu copy backend: stopped");
    queue_.push_back(std::move(op));
    ++enqueued_;
    cv_.SignalAll();
    return Status::Ok();
  }
  Status FirstFailureUpTo(uint64_t event) FLATKV_REQUIRES(mu_) {
    if (first_failure_at_ != 0 && first_failure_at_ <= event) return first_failure_;
    return Status::Ok();
  }
  void Run() {
    for (;;) {
      std::function<Status()> op;
      {
        MutexLock lock(&mu_);
        while (queue_.empty() && !stop_) cv_.Wait(&mu_);
        if (queue_.empty()) return;
        op = std::move(queue_.front());
        queue_.pop_front();
      }
      if (queue_delay_.count() > 0) std::this_thread::sleep_for(queue_delay_);
      Status s = op();
      MutexLock lock(&mu_);
      ++done_;
      if (!s.ok()) {
        stats_.failed_ops++;
        if (first_failure_at_ == 0) {
          first_failure_at_ = done_;
          first_failure_ = s;
        }
      }
      cv_.SignalAll();
    }
  }

  const uint64_t fail_after_;
  const bool file_reads_;
  const uint64_t fail_reads_;
  const bool decodes_;
  const uint64_t fail_decodes_;
  const std::chrono::microseconds queue_delay_;
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<std::function<Status()>> queue_ FLATKV_GUARDED_BY(mu_);
  uint64_t enqueued_ FLATKV_GUARDED_BY(mu_) = 0;
  uint64_t done_ FLATKV_GUARDED_BY(mu_) = 0;
  uint64_t copies_ FLATKV_GUARDED_BY(mu_) = 0;
  uint64_t reads_ FLATKV_GUARDED_BY(mu_) = 0;
  uint64_t decode_calls_ FLATKV_GUARDED_BY(mu_) = 0;
  std::set<std::pair<dev_t, ino_t>> files_ FLATKV_GUARDED_BY(mu_);
  std::unique_ptr<DramQueue> readers_;  // made at the first read (under mu_), then only used
  uint64_t first_failure_at_ FLATKV_GUARDED_BY(mu_) = 0;
  Status first_failure_ FLATKV_GUARDED_BY(mu_);
  bool stop_ FLATKV_GUARDED_BY(mu_) = false;
  CopyBackendStats stats_ FLATKV_GUARDED_BY(mu_);
  std::mutex device_mu_;  // the device allocations, and one DeviceAccess at a time
  std::map<const std::byte*, uint64_t> device_;
  std::thread worker_;
};

}  // namespace

std::unique_ptr<CopyBackend> MakeCpuCopyBackend(const CpuBackendOptions& options) {
  return std::make_unique<CpuCopyBackend>(options);
}


Result<std::unique_ptr<CopyBackend>> MakeCopyBackend(const std::string& name) {
  if (name == "cpu") return MakeCpuCopyBackend(CpuBackendOptions{0, /*file_reads=*/true, 0, /*decodes=*/true, 0});
  if (name == "cuda") return MakeCudaCopyBackend(0);
  return Status::InvalidArgument("copy backend '" + name + "': expected cpu or cuda");
}

}  // namespace flatkv::gpu
