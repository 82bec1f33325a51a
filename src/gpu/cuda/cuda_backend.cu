// CudaCopyBackend (gpu/copy_backend.h): device memory from cudaMalloc, one
// dedicated non-blocking stream for every copy, host memory pinned with
// cudaHostRegister so cudaMemcpyAsync from it is DMA, cudaEvents as the
// window's per-layer events, and a gather kernel for scatters into an
// engine's paged cache (one launch per layer, never one copy per page).
// Built only with -DFLATKV_CUDA=ON (docs/gpu.md).
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <vector>

#include "gpu/copy_backend.h"
#include "gpu/cuda/cuda_util.h"

namespace flatkv::gpu {
namespace {

// A launch's page table, passed by value (kernel parameters hold up to
// 32 KiB since CUDA 12.1), so a scatter needs no allocation and no sync.
constexpr uint32_t kPagesPerLaunch = 1024;
struct PageTable {
  PageCopy page[kPagesPerLaunch];
};

// One thread block per page; 16-byte words where both ends allow.
__global__ void GatherPages(const std::byte* slot, const PageTable table, uint32_t n) {
  const uint32_t p = blockIdx.x;
  if (p >= n) return;
  const PageCopy pc = table.page[p];
  const std::byte* src = slot + pc.src;
  std::byte* dst = pc.dst;
  const bool wide = (reinterpret_cast<uintptr_t>(src) % 16 == 0) && (reinterpret_cast<uintptr_t>(dst) % 16 == 0);
  uint64_t i = 0;
  if (wide) {
    const uint64_t words = pc.bytes / 16;
    for (uint64_t w = threadIdx.x; w < words; w += blockDim.x)
      reinterpret_cast<uint4*>(dst)[w] = reinterpret_cast<const uint4*>(src)[w];
    i = words * 16;
  }
  for (uint64_t b = i + threadIdx.x; b < pc.bytes; b += blockDim.x) dst[b] = src[b];
}

class CudaCopyBackend final : public CopyBackend {
 public:
  static Result<std::unique_ptr<CopyBackend>> Open(int device) {
    int count = 0;
    FLATKV_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
    if (device < 0 || device >= count)
      return Status::InvalidArgument("copy backend 'cuda': device " + std::to_string(device) + " of " +
                                     std::to_string(count));
    FLATKV_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
    std::unique_ptr<CudaCopyBackend> b(new CudaCopyBackend(device));
    FLATKV_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&b->stream_, cudaStreamNonBlocking), "cudaStreamCreate"));
    return std::unique_ptr<CopyBackend>(std::move(b));
  }
  ~CudaCopyBackend() override {
    cudaSetDevice(device_);
    if (stream_) cudaStreamSynchronize(stream_);
    for (auto& [id, ev] : events_) cudaEventDestroy(ev.event);
    for (auto& [p, bytes] : registered_) cudaHostUnregister(const_cast<std::byte*>(p));
    if (stream_) cudaStreamDestroy(stream_);
  }
  std::string name() const override { return "cuda"; }

  std::byte* AllocateDevice(uint64_t bytes) override {
    cudaSetDevice(device_);
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
    return static_cast<std::byte*>(p);
  }
  void FreeDevice(std::byte* p) override {
    cudaSetDevice(device_);
    cudaFree(p);
  }
  Status RegisterHost(const std::byte* p, uint64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (registered_.count(p)) return Status::Ok();
    cudaSetDevice(device_);
    const cudaError_t e = cudaHostRegister(const_cast<std::byte*>(p), bytes, cudaHostRegisterPortable);
    if (e == cudaErrorHostMemoryAlreadyRegistered) {  // inside a range pinned before: already DMA
      (void)cudaGetLastError();
      return Status::Ok();
    }
    FLATKV_RETURN_IF_ERROR(CudaStatus(e, "cudaHostRegister of " + std::to_string(bytes) + " bytes"));
    registered_[p] = bytes;
    stats_.registered_bytes += bytes;
    return Status::Ok();
  }
  void UnregisterHost(const std::byte* p) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = registered_.find(p);
    if (it == registered_.end()) return;
    cudaSetDevice(device_);
    cudaHostUnregister(const_cast<std::byte*>(p));
    stats_.registered_bytes -= it->second;
    registered_.erase(it);
  }

  Status EnqueueCopy(std::byte* dst, const std::byte* src, uint64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    cudaSetDevice(device_);
    Status s = CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
    if (!s.ok()) {
      stats_.failed_ops++;
      return s;
    }
    stats_.h2d_bytes += bytes;
    stats_.h2d_copies++;
    return s;
  }
  Status EnqueueScatter(const std::byte* slot, std::span<const PageCopy> pages) override {
    if (pages.empty()) return Status::Ok();
    std::lock_guard<std::mutex> lock(mu_);
    cudaSetDevice(device_);
    for (size_t at = 0; at < pages.size(); at += kPagesPerLaunch) {
      const uint32_t n = static_cast<uint32_t>(std::min<size_t>(kPagesPerLaunch, pages.size() - at));
      PageTable table;
      std::copy(pages.begin() + at, pages.begin() + at + n, table.page);
      GatherPages<<<n, 256, 0, stream_>>>(slot, table, n);
      FLATKV_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "GatherPages launch"));
    }
    stats_.scatter_pages += pages.size();
    return Status::Ok();
  }
  uint64_t Record() override {
    std::lock_guard<std::mutex> lock(mu_);
    cudaSetDevice(device_);
    if (events_.size() >= kMaxEvents)  // retire the events that have passed and nobody waits on
      for (auto it = events_.begin(); it != events_.end();)
        if (it->second.waiters == 0 && cudaEventQuery(it->second.event) == cudaSuccess) {
          cudaEventDestroy(it->second.event);
          it = events_.erase(it);
        } else {
          ++it;
        }
    cudaEvent_t ev;
    if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) return 0;
    cudaEventRecord(ev, stream_);
    const uint64_t id = ++next_event_;
    events_[id] = Event{ev, 0};
    return id;
  }
  // A waited event is retired by its last waiter (a GpuWindow records and
  // waits one per copy): waiters keep Record from destroying it under them.
  Status Wait(uint64_t event) override {
    cudaEvent_t ev;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = events_.find(event);
      if (it == events_.end()) return event == 0 ? Status::IoError("copy backend 'cuda': no event (cudaEventCreate failed)")
                                                 : Status::Ok();  // waited for and retired already
      ev = it->second.event;
      it->second.waiters++;
    }
    cudaSetDevice(device_);
    Status s = CudaStatus(cudaEventSynchronize(ev), "cudaEventSynchronize");
    std::lock_guard<std::mutex> lock(mu_);
    auto it = events_.find(event);
    if (--it->second.waiters == 0 && s.ok()) {
      cudaEventDestroy(ev);
      events_.erase(it);
    }
    return s;
  }
  bool Done(uint64_t event) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = events_.find(event);
    if (it == events_.end()) return true;
    return cudaEventQuery(it->second.event) != cudaErrorNotReady;
  }
  Status CopyToHost(std::byte* dst, const std::byte* src, uint64_t bytes) override {
    cudaSetDevice(device_);
    std::lock_guard<std::mutex> lock(mu_);
    FLATKV_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync D2H"));
    return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  CopyBackendStats Stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  static constexpr size_t kMaxEvents = 4096;
  explicit CudaCopyBackend(int device) : device_(device) {}
  int device_;
  cudaStream_t stream_ = nullptr;
  mutable std::mutex mu_;
  struct Event {
    cudaEvent_t event;
    int waiters;  // threads in Wait on it
  };
  std::map<uint64_t, Event> events_;
  uint64_t next_event_ = 0;
  std::map<const std::byte*, uint64_t> registered_;
  CopyBackendStats stats_;
};

}  // namespace

Result<std::unique_ptr<CopyBackend>> MakeCudaCopyBackend(int device) { return CudaCopyBackend::Open(device); }

}  // namespace flatkv::gpu
