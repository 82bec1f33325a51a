// CopyBackend: how a restore's layers reach an accelerator's memory, the
// landing side of a restore (docs/architecture.md, "Media and sources",
// and docs/gpu.md). A backend owns device memory for a bounded window, one
// in-order copy queue (a CUDA stream), and events recorded on it; the
// GpuWindow (gpu/gpu_window.h) drives it layer by layer.
//
//  - CpuCopyBackend (always built): "device" memory is host memory and the
//    queue is one worker thread, so the window's whole logic (slot
//    recycling, layer ordering, per-layer events, failures, cancellation)
//    runs and is tested on any machine.
//  - CudaCopyBackend (gpu/cuda/, only with -DFLATKV_CUDA=ON): device memory
//    from cudaMalloc, copies by cudaMemcpyAsync on a dedicated stream from
//    host memory pinned with cudaHostRegister, cudaEvents, and a gather
//    kernel that scatters a layer into an engine's paged cache.
//
// Thread-safety: Enqueue*, Record and Wait/Done may be called from any
// thread; operations run in the order they were enqueued.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "flatkv/status.h"

namespace flatkv::gpu {

// One page copy of a scatter: `bytes` from offset `src` of a window slot to
// device address `dst` (an engine's paged cache).
struct PageCopy {
  uint64_t src = 0;
  std::byte* dst = nullptr;
  uint64_t bytes = 0;
};

struct CopyBackendStats {
  uint64_t h2d_bytes = 0;        // host -> device bytes copied
  uint64_t h2d_copies = 0;
  uint64_t registered_bytes = 0;  // host memory pinned for DMA
  uint64_t scatter_pages = 0;
  uint64_t failed_ops = 0;
};

class CopyBackend {
 public:
  virtual ~CopyBackend() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda"

  // Device memory of `bytes` (the window's slots); null when none can be had.
  virtual std::byte* AllocateDevice(uint64_t bytes) = 0;
  virtual void FreeDevice(std::byte* p) = 0;
  // Pins host memory so copies from it are DMA (the store's DRAM arena and
  // host window); idempotent per range.
  virtual Status RegisterHost(const std::byte* p, uint64_t bytes) = 0;
  virtual void UnregisterHost(const std::byte* p) = 0;

  // Queues a copy of `bytes` from host `src` to device `dst`.
  virtual Status EnqueueCopy(std::byte* dst, const std::byte* src, uint64_t bytes) = 0;
  // Queues the copies of one scatter: slot bytes at `slot` to engine pages.
  virtual Status EnqueueScatter(const std::byte* slot, std::span<const PageCopy> pages) = 0;
  // An event after everything queued so far; Wait blocks until it has
  // passed and returns the first failure of an operation before it.
  virtual uint64_t Record() = 0;
  virtual Status Wait(uint64_t event) = 0;
  virtual bool Done(uint64_t event) = 0;
  // Copies device bytes back to host memory, synchronously (tests, checks).
  virtual Status CopyToHost(std::byte* dst, const std::byte* src, uint64_t bytes) = 0;

  virtual CopyBackendStats Stats() const = 0;
};

// The CPU backend. With `fail_after` > 0 the fail_after-th copy (and every
// later one) fails, to test the window's failure handling.
std::unique_ptr<CopyBackend> MakeCpuCopyBackend(uint64_t fail_after = 0);
// The CUDA backend on device `device`; an error naming why when flatkv was
// built without FLATKV_CUDA or no device is usable.
Result<std::unique_ptr<CopyBackend>> MakeCudaCopyBackend(int device = 0);
// "cpu" or "cuda".
Result<std::unique_ptr<CopyBackend>> MakeCopyBackend(const std::string& name);

}  // namespace flatkv::gpu
