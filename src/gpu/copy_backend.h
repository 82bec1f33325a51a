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
//    host memory pinned with cudaHostRegister, cudaEvents, a gather kernel
//    that scatters a layer into an engine's paged cache, and file reads into
//    device memory by cuFile (libcufile.so.0, loaded at run time).
//
// File reads (SSD hits straight into device memory) run on the backend's
// own reader threads, each a synchronous read of one request, several at
// once, and are checked in device memory (Checksums) before their layer is
// valid. file_read_path() says how they go, as the driver reports it:
//  - "gds": cuFile with the nvidia-fs driver loaded (GPUDirect Storage: the
//    SSD DMAs into device memory);
//  - "cufile-compat": cuFile in its compatibility mode (no nvidia-fs: cuFile
//    reads into its own pinned buffers and copies; never counted as GDS);
//  - "cpu-pread": the CPU backend's stand-in (pread into its memory);
//  - "": none (no cuFile, or the CPU backend without file reads); SSD hits
//    then go through the restore's pinned host window ("bounce").
//
// Decoding (coded extents whose slices the backend decodes: int8 and kivi):
// a restore carries the checked encoded slices over, one copy per decode
// job, and they are decoded into their destinations in device memory.
//
// Thread-safety: Enqueue*, Record and Wait/Done may be called from any
// thread; operations run in the order they were enqueued.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "flatkv/codec.h"
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
  uint64_t file_reads = 0;       // file reads into device memory
  uint64_t file_read_bytes = 0;
  uint64_t failed_file_reads = 0;
  uint64_t registered_files = 0;  // files registered for them (cuFileHandleRegister)
  uint64_t decoded_slices = 0;    // slices decoded on the device
  uint64_t decode_in_bytes = 0;   // encoded bytes carried over for them
};

// Counts one file read into device memory in `stats` (a backend's or a
// window's: both name these fields alike).
template <typename Stats>
void CountFileRead(Stats& stats, bool ok, uint64_t bytes) {
  if (ok) {
    stats.file_reads++;
    stats.file_read_bytes += bytes;
  } else {
    stats.failed_file_reads++;
  }
}

class CopyBackend {
 public:
  virtual ~CopyBackend() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda"

  // Device memory of `bytes` (the window's slots), 4 KiB-aligned (a restore
  // reads an SSD run in place only at an aligned destination); null when
  // none can be had.
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

  // File reads into device memory (above): their path, "" when none; and
  // why there are none (empty when there are).
  virtual std::string file_read_path() const = 0;
  virtual std::string no_file_reads_why() const = 0;
  // Makes file `fd` (opened O_DIRECT) readable by SubmitRead; idempotent per
  // open file. An error names why this file cannot be (its SSD hits then
  // go through the host window).
  virtual Status RegisterFile(int fd) = 0;
  // Reads `bytes` at `offset` of a registered file into device `dst` (all
  // 4 KiB aligned) on a reader thread, then done(status) on that thread.
  virtual void SubmitRead(int fd, uint64_t offset, std::byte* dst, uint64_t bytes, std::function<void(Status)> done) = 0;
  // The block checksums (the store's BlockChecksum, XXH3-64) of `n` adjacent
  // slices of `bytes` each at device `slices`, into host `out[0..n)`;
  // synchronous, callable from several threads at once.
  virtual Status Checksums(const std::byte* slices, uint32_t n, uint64_t bytes, uint64_t* out) = 0;

  // Decoding on the device: whether it decodes `codec`'s slices of
  // `layout` (int8 and kivi, f32/f16/bf16, where it has decoders), and the
  // decode of `slices` (host memory, whole encoded slices in one buffer, each
  // after the one before: carried over in one copy, gaps included; GpuWindow
  // refuses slices that are not) into device `dst[j]`; synchronous,
  // callable from several threads at once.
  virtual bool DecodesCodec(const Codec& codec, const SliceLayout& layout) const = 0;
  virtual Status DecodeSlices(const SliceLayout& layout, std::span<const std::span<const std::byte>> slices,
                              std::span<std::byte* const> dst) = 0;

  virtual CopyBackendStats Stats() const = 0;
};

// The CPU backend. With `fail_after` > 0 the fail_after-th copy (and every
// later one) fails, to test the window's failure handling. With
// `file_reads` it reads files into its memory ("cpu-pread"), the fail_reads-th
// read (and every later one) failing when that is > 0.
// With `decodes` it decodes int8 and kivi slices into its memory with the
// CPU codec, as the CUDA backend's decoders do on a GPU, the fail_decodes-th
// call (and every later one) failing when that is > 0. With `queue_delay_us`
// each queued copy or scatter waits that long before it runs: a busy stream,
// which file reads and decodes (not on the queue) overtake.
struct CpuBackendOptions {
  uint64_t fail_after = 0;
  bool file_reads = false;
  uint64_t fail_reads = 0;
  bool decodes = false;
  uint64_t fail_decodes = 0;
  uint32_t queue_delay_us = 0;
};
std::unique_ptr<CopyBackend> MakeCpuCopyBackend(const CpuBackendOptions& options);
inline std::unique_ptr<CopyBackend> MakeCpuCopyBackend(uint64_t fail_after = 0) {
  return MakeCpuCopyBackend(CpuBackendOptions{fail_after, false, 0, false, 0});
}
// The CUDA backend on device `device`; an error naming why when flatkv was
// built without FLATKV_CUDA or no device is usable.
Result<std::unique_ptr<CopyBackend>> MakeCudaCopyBackend(int device = 0);
// "cpu" (with file reads and decoders) or "cuda".
Result<std::unique_ptr<CopyBackend>> MakeCopyBackend(const std::string& name);

}  // namespace flatkv::gpu
