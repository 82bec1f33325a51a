// GpuWindow: a restore streamed into a bounded window of device memory,
// layer by layer (docs/gpu.md). The restore lands each layer in host memory
// (the store's window, or its DRAM arena when pinned); a pump thread copies
// it into device slot `layer % slots` through the copy backend's queue and
// records one event per layer, releasing the host layer once that copy has
// passed. A consumer waits for layer l's event alone (WaitLayer), so it
// computes on layer l while layers l+1.. are still loading or copying, and
// frees the slot with ReleaseLayer(l), which lets layer l + slots in.
//
// Failures: a layer whose restore read or copy failed is returned as an
// error by WaitLayer (the engine recomputes it); Finish then reports 0
// valid blocks. Cancel stops the pump: no further layer is copied, copies in
// flight are waited for, and WaitLayer of a layer not copied fails.
//
// Thread-safety: one consumer calls WaitLayer/ReleaseLayer/Finish/Cancel;
// the pump is internal.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "flatkv/store.h"
#include "gpu/copy_backend.h"

namespace flatkv::gpu {

struct DeviceLayer {
  uint32_t layer = 0;
  uint32_t blocks = 0;            // blocks of the layer valid so far
  const std::byte* data = nullptr;  // device memory: blocks * block layer bytes
};

struct GpuWindowStats {
  uint32_t layers_copied = 0;
  uint32_t slot_waits = 0;   // times the pump waited for the consumer to free a slot
  uint32_t host_waits = 0;   // times the pump found the restore's next layer beyond its window
  uint32_t pageable_copies = 0;  // layers copied from host memory the backend could not pin
};

class GpuWindow {
 public:
  // Takes `restore` (of `layers` layers of `block_layer_bytes` per block)
  // and streams it into `slots` device slots.
  static Result<std::unique_ptr<GpuWindow>> Start(CopyBackend* backend, std::unique_ptr<Restore> restore,
                                                  uint32_t layers, uint64_t block_layer_bytes, uint32_t slots);
  ~GpuWindow();  // cancels, waits for the pump and the copies in flight

  uint32_t slots() const { return slots_; }
  uint32_t hit_blocks() const { return hit_; }
  // Layer l in device memory, once its copy has passed; l < released + slots.
  Result<DeviceLayer> WaitLayer(uint32_t layer);
  // Queues a scatter of layer l's slot into an engine's paged cache (after
  // WaitLayer(l), before ReleaseLayer(l)); returns the event to wait for.
  Result<uint64_t> ScatterLayer(uint32_t layer, std::span<const PageCopy> pages);
  void ReleaseLayer(uint32_t layer);
  // Waits for every layer; the blocks valid in every layer (0 after a failure).
  uint32_t Finish();
  void Cancel();
  GpuWindowStats Stats() const;

 private:
  struct LayerState {
    bool copied = false;     // the copy is queued (event set) or the layer failed
    bool released = false;
    uint64_t event = 0;
    uint32_t blocks = 0;
    Status status;
  };
  GpuWindow(CopyBackend* backend, std::unique_ptr<Restore> restore, uint32_t layers, uint64_t block_layer_bytes,
            uint32_t slots);
  void Pump();
  std::byte* Slot(uint32_t layer) const { return device_ + uint64_t{layer % slots_} * slot_bytes_; }

  CopyBackend* backend_;
  std::unique_ptr<Restore> restore_;  // the pump's alone (Finish after it ends)
  const uint32_t layers_, slots_, hit_;
  const uint64_t slot_bytes_;
  std::byte* device_ = nullptr;
  uint32_t restore_valid_ = 0;  // the restore's Finish, once the pump ends
  std::vector<const std::byte*> registered_;  // host layers pinned (the pump's; unpinned at destruction)

  mutable Mutex mu_;
  CondVar cv_;
  std::vector<LayerState> state_ FLATKV_GUARDED_BY(mu_);
  bool cancelled_ FLATKV_GUARDED_BY(mu_) = false;
  bool pump_done_ FLATKV_GUARDED_BY(mu_) = false;
  GpuWindowStats stats_ FLATKV_GUARDED_BY(mu_);
  std::thread pump_;
};

}  // namespace flatkv::gpu
