// GpuWindow: a restore streamed into a bounded window of device memory,
// layer by layer (docs/gpu.md). It starts the store's restore with device
// slots as its destinations and itself as their DeviceLanding (flatkv/store.h):
// layer l's blocks land in slot l % slots. DRAM hits are copied straight
// from the store's arena, pinned, by the copy backend (DMA, no host copy);
// SSD hits are read straight into the slot by the backend's file reads
// (cuFile) where it has them and can read the segment file, and checked
// there by the checksum kernel; coded extents whose codec the backend
// decodes (int8, kivi) are checked on the host, carried over encoded and
// decoded there; the rest (SSD without file reads, other coded extents,
// media past the index) are read, checked and decoded in the restore's host
// window (pinned: the bounce buffer) and copied over once their layer is
// whole. A layer is ready once its copies have passed: a consumer computes
// on layer l while layers l+1.. still load, and frees the slot with
// ReleaseLayer(l), which lets layer l + slots in: once the consumer's own
// kernels reading the slot have finished (file reads and decodes refill a
// slot outside any stream's order); the window's scatters of that layer are
// waited for by ReleaseLayer itself.
//
// Failures: a failed copy makes the blocks it carried and every later one
// misses, as a failed read does: later layers carry fewer blocks and Finish
// returns the final count. Cancel makes every later copy fail, so the
// restore ends at once; WaitLayer then fails.
//
// Thread-safety: one consumer calls WaitLayer/ScatterLayer/ReleaseLayer/
// Finish/Cancel; the restore's I/O threads call Copy.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/mutex.h"
#include "flatkv/store.h"
#include "gpu/copy_backend.h"

namespace flatkv::gpu {

struct DeviceLayer {
  uint32_t layer = 0;
  uint32_t blocks = 0;              // blocks of the layer valid
  const std::byte* data = nullptr;  // device memory: blocks * block layer bytes
};

struct GpuWindowStats {
  uint64_t copies = 0;          // host -> device copies (a DRAM run's layer is one; a window layer one per run)
  uint64_t copy_bytes = 0;
  uint64_t failed_copies = 0;
  uint64_t pinned_bytes = 0;    // host window memory pinned for this restore
  uint64_t unpinned_bytes = 0;  // host memory the backend could not pin (copied from pageable memory)
  uint64_t bounce_bytes = 0;    // of copy_bytes, copied from the host window (SSD and the rest, not DRAM)
  uint64_t file_reads = 0;      // SSD reads straight into device memory (the backend's file_read_path())
  uint64_t file_read_bytes = 0;
  uint64_t failed_file_reads = 0;
  uint64_t files_refused = 0;   // segment files the backend could not register (read through the window)
  uint64_t checksum_calls = 0;  // device checksum launches (one per file read)
  uint64_t decoded_slices = 0;  // coded slices decoded on the device (int8, kivi)
  uint64_t decode_in_bytes = 0; // encoded bytes carried over for them
  uint64_t failed_decodes = 0;
};

class GpuWindow final : public DeviceLanding {
 public:
  // Restores `chain` from `store` into `slots` device slots, each sized for
  // the whole chain's layer. Pins the store's DRAM arena for DMA the first
  // time (UnpinStore undoes it, before the store is destroyed).
  // With `file_reads` false, SSD hits go through the host window even where
  // the backend reads files (to measure the bounce path beside it); with
  // `decodes` false, coded extents are decoded on the host even where the
  // backend decodes their codec.
  static Result<std::unique_ptr<GpuWindow>> Start(CopyBackend* backend, Store& store, std::span<const BlockKey> chain,
                                                  uint32_t slots, bool file_reads = true, bool decodes = true);
  static void UnpinStore(CopyBackend* backend, const Store& store);
  ~GpuWindow() override;  // cancels, waits for the restore's I/O and the copies in flight

  uint32_t slots() const { return slots_; }
  uint32_t hit_blocks() const { return restore_ ? restore_->hit_blocks() : 0; }
  // Layer l in device memory, once its copies have passed; layers in order,
  // l < released + slots.
  Result<DeviceLayer> WaitLayer(uint32_t layer);
  // Queues a scatter of layer l's slot into an engine's paged cache (after
  // WaitLayer(l), before ReleaseLayer(l)); returns the event to wait for.
  Result<uint64_t> ScatterLayer(uint32_t layer, std::span<const PageCopy> pages);
  // Frees layer l's slot for layer l + slots, after waiting for the
  // layer's scatters to have read it.
  void ReleaseLayer(uint32_t layer);
  // Waits for every layer; the blocks valid in every layer (0 once cancelled).
  uint32_t Finish();
  void Cancel();
  GpuWindowStats Stats() const;

  // DeviceLanding, called by the restore.
  void Pin(std::span<const std::byte> host) override;
  Status Copy(std::byte* dst, const std::byte* src, uint64_t bytes) override;
  bool ReadsFile(int fd) override;
  void ReadFile(int fd, uint64_t offset, std::byte* dst, uint64_t bytes, std::function<void(Status)> done) override;
  Status Checksums(const std::byte* slices, uint32_t n, uint64_t bytes, uint64_t* out) override;
  bool Decodes(const Codec& codec, const SliceLayout& layout) override;
  Status Decode(const SliceLayout& layout, std::span<const std::span<const std::byte>> slices,
                std::span<std::byte* const> dst) override;

 private:
  enum class Layer : uint8_t { kPending, kWaited, kReleased };
  GpuWindow(CopyBackend* backend, uint32_t layers, uint64_t block_layer_bytes, uint32_t slots, uint64_t slot_bytes,
            bool file_reads, bool decodes)
      : backend_(backend),
        layers_(layers),
        slots_(slots),
        lb_(block_layer_bytes),
        slot_bytes_(slot_bytes),
        file_reads_(file_reads && !backend->file_read_path().empty()),
        decodes_(decodes) {}
  std::byte* Slot(uint32_t layer) const { return device_ + uint64_t{layer % slots_} * slot_bytes_; }

  CopyBackend* backend_;
  const uint32_t layers_, slots_;
  const uint64_t lb_, slot_bytes_;
  const bool file_reads_;
  const bool decodes_;
  std::byte* device_ = nullptr;           // allocated when the restore asks for its first destination
  Status no_memory_;                      // why it could not be
  // The restore's host windows (a copy from one is a bounce), and those of
  // them pinned (unpinned at destruction).
  std::vector<std::span<const std::byte>> windows_ FLATKV_GUARDED_BY(mu_);
  std::vector<const std::byte*> pinned_ FLATKV_GUARDED_BY(mu_);
  std::unique_ptr<Restore> restore_;      // destroyed first: its I/O threads call Copy
  std::vector<Layer> state_;              // the consumer's
  std::vector<uint64_t> scattered_;       // the consumer's: each layer's last scatter event (0: none)
  std::atomic<bool> cancelled_{false};

  mutable Mutex mu_;
  GpuWindowStats stats_ FLATKV_GUARDED_BY(mu_);
};

}  // namespace flatkv::gpu
