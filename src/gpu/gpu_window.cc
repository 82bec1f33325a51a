#include "gpu/gpu_window.h"

#include <algorithm>

#include "common/log.h"

namespace flatkv::gpu {
namespace {

constexpr uint64_t kMaxSliceGap = 4096;  // between slices carried in one copy

// Slices as CopyBackend::DecodeSlices takes them, carried over in one copy:
// each starts at or after the end of the one before, at most kMaxSliceGap
// bytes after it (one buffer); an error says which slice is not.
Status CheckSlicesInOrder(std::span<const std::span<const std::byte>> slices) {
  for (size_t j = 1; j < slices.size(); ++j) {
    const std::byte* end = slices[j - 1].data() + slices[j - 1].size();
    if (slices[j].data() < end || uint64_t(slices[j].data() - end) > kMaxSliceGap)
      return Status::InvalidArgument("decode: slice " + std::to_string(j) + " does not follow slice " +
                                     std::to_string(j - 1) + " in one buffer (" +
                                     (slices[j].data() < end ? std::string("it starts before that one ends")
                                                             : std::to_string(slices[j].data() - end) + " bytes after it") +
                                     ")");
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<GpuWindow>> GpuWindow::Start(CopyBackend* backend, Store& store, std::span<const BlockKey> chain,
                                                    uint32_t slots, bool file_reads, bool decodes) {
  if (backend == nullptr) return Status::InvalidArgument("gpu window: no copy backend");
  const uint32_t layers = store.options().shape.layers;
  const uint64_t lb = store.BlockLayerBytes();
  if (slots == 0) return Status::InvalidArgument("gpu window: slots=0 (a window holds at least one layer)");
  if (chain.empty()) return Status::InvalidArgument("gpu window: an empty chain");
  slots = std::min(slots, layers);
  const uint64_t slot_bytes = (chain.size() * lb + 4095) / 4096 * 4096;
  std::unique_ptr<GpuWindow> w(new GpuWindow(backend, layers, lb, slots, slot_bytes, file_reads, decodes));
  w->state_.assign(layers, Layer::kPending);
  w->scattered_.assign(layers, 0);
  // DRAM hits are copied from the arena: pinned once, so those copies are DMA.
  if (std::span<const std::byte> dram = store.DramMemory(); !dram.empty() && !backend->RegisterHost(dram.data(), dram.size()).ok()) {
    MutexLock lock(&w->mu_);
    w->stats_.unpinned_bytes += dram.size();
  }
  RestoreTarget target;
  target.device = w.get();
  target.reuse_layers = slots;
  target.destination = [p = w.get()](uint32_t layer, uint32_t block) -> std::byte* {
    if (p->device_ == nullptr && p->no_memory_.ok()) {  // only once something hits
      p->device_ = p->backend_->AllocateDevice(uint64_t{p->slots_} * p->slot_bytes_);
      if (p->device_ == nullptr)
        p->no_memory_ = Status::NoSpace("gpu window: cannot allocate " + std::to_string(p->slots_) + " x " +
                                        std::to_string(p->slot_bytes_) + " bytes of " + p->backend_->name() +
                                        " device memory");
    }
    return p->device_ ? p->Slot(layer) + uint64_t{block} * p->lb_ : nullptr;
  };
  auto restore = store.StartRestore(chain, target);
  if (!w->no_memory_.ok()) return w->no_memory_;
  if (!restore.ok()) return restore.status();
  w->restore_ = std::move(restore).value();
  return w;
}

void GpuWindow::UnpinStore(CopyBackend* backend, const Store& store) {
  if (std::span<const std::byte> dram = store.DramMemory(); !dram.empty()) backend->UnregisterHost(dram.data());
}

GpuWindow::~GpuWindow() {
  Cancel();
  restore_.reset();  // waits for its I/O: no copy is made after this
  if (device_) {
    (void)backend_->Wait(backend_->Record());  // nor a scatter still reading the slots
    backend_->FreeDevice(device_);
  }
  MutexLock lock(&mu_);
  for (const std::byte* p : pinned_) backend_->UnregisterHost(p);  // before the store reuses or frees them
}

void GpuWindow::Pin(std::span<const std::byte> host) {
  const bool ok = backend_->RegisterHost(host.data(), host.size()).ok();
  MutexLock lock(&mu_);
  windows_.push_back(host);
  if (ok) {
    pinned_.push_back(host.data());
    stats_.pinned_bytes += host.size();
  } else {
    stats_.unpinned_bytes += host.size();
  }
}

Status GpuWindow::Copy(std::byte* dst, const std::byte* src, uint64_t bytes) {
  Status s = cancelled_.load() ? Status::Aborted("gpu window: cancelled") : backend_->EnqueueCopy(dst, src, bytes);
  if (s.ok()) s = backend_->Wait(backend_->Record());
  MutexLock lock(&mu_);
  if (s.ok()) {
    stats_.copies++;
    stats_.copy_bytes += bytes;
    for (std::span<const std::byte> w : windows_)
      if (src >= w.data() && src < w.data() + w.size()) stats_.bounce_bytes += bytes;
  } else {
    stats_.failed_copies++;
  }
  return s;
}

bool GpuWindow::ReadsFile(int fd) {
  if (!file_reads_) return false;
  const Status s = backend_->RegisterFile(fd);
  if (!s.ok()) {
    LogWarning("gpu window: " + s.ToString() + "; that file's SSD hits go through the host window");
    MutexLock lock(&mu_);
    stats_.files_refused++;
  }
  return s.ok();
}

void GpuWindow::ReadFile(int fd, uint64_t offset, std::byte* dst, uint64_t bytes, std::function<void(Status)> done) {
  if (cancelled_.load()) {
    {
      MutexLock lock(&mu_);
      stats_.failed_file_reads++;
    }
    return done(Status::Aborted("gpu window: cancelled"));
  }
  // The window is not touched after done: the restore it serves, and so
  // the window, may be gone once its last read has settled.
  backend_->SubmitRead(fd, offset, dst, bytes, [this, bytes, done = std::move(done)](Status s) {
    {
      MutexLock lock(&mu_);
      CountFileRead(stats_, s.ok(), bytes);
    }
    done(std::move(s));
  });
}

bool GpuWindow::Decodes(const Codec& codec, const SliceLayout& layout) {
  return decodes_ && backend_->DecodesCodec(codec, layout);
}

Status GpuWindow::Decode(const SliceLayout& layout, std::span<const std::span<const std::byte>> slices,
                         std::span<std::byte* const> dst) {
  Status s = cancelled_.load() ? Status::Aborted("gpu window: cancelled") : CheckSlicesInOrder(slices);
  if (s.ok()) s = backend_->DecodeSlices(layout, slices, dst);
  MutexLock lock(&mu_);
  if (s.ok()) {
    stats_.decoded_slices += slices.size();
    for (const auto& slice : slices) stats_.decode_in_bytes += slice.size();
  } else {
    stats_.failed_decodes++;
  }
  return s;
}

Status GpuWindow::Checksums(const std::byte* slices, uint32_t n, uint64_t bytes, uint64_t* out) {
  {
    MutexLock lock(&mu_);
    stats_.checksum_calls++;
  }
  return backend_->Checksums(slices, n, bytes, out);
}

Result<DeviceLayer> GpuWindow::WaitLayer(uint32_t layer) {
  if (layer >= layers_)
    return Status::InvalidArgument("gpu window: layer " + std::to_string(layer) + " of a " + std::to_string(layers_) +
                                   "-layer model");
  if (state_[layer] == Layer::kReleased)
    return Status::FailedPrecondition("gpu window: layer " + std::to_string(layer) + " was already released");
  if (layer >= slots_ && state_[layer - slots_] != Layer::kReleased)
    return Status::FailedPrecondition("gpu window: layer " + std::to_string(layer) + " is beyond the window of " +
                                      std::to_string(slots_) + " slots; release layer " + std::to_string(layer - slots_) +
                                      " first");
  if (cancelled_.load()) return Status::Aborted("gpu window: cancelled before layer " + std::to_string(layer));
  if (restore_->hit_blocks() == 0) return DeviceLayer{layer, 0, nullptr};
  FLATKV_ASSIGN_OR_RETURN(LayerView v, restore_->WaitLayer(layer));
  if (cancelled_.load()) return Status::Aborted("gpu window: cancelled before layer " + std::to_string(layer));
  if (device_ == nullptr) {  // a restore that asks for destinations as it delivers (RemoteStore), none yet
    if (!no_memory_.ok()) return no_memory_;
    return DeviceLayer{layer, 0, nullptr};
  }
  state_[layer] = Layer::kWaited;
  return DeviceLayer{layer, v.blocks, Slot(layer)};
}

Result<uint64_t> GpuWindow::ScatterLayer(uint32_t layer, std::span<const PageCopy> pages) {
  if (layer >= layers_) return Status::InvalidArgument("gpu window: scatter of layer " + std::to_string(layer));
  if (state_[layer] != Layer::kWaited)
    return Status::FailedPrecondition("gpu window: scatter of layer " + std::to_string(layer) +
                                      (state_[layer] == Layer::kReleased ? ", already released" : " before WaitLayer"));
  for (const PageCopy& p : pages)
    if (p.src + p.bytes > slot_bytes_ || p.dst == nullptr)
      return Status::InvalidArgument("gpu window: a page copy of " + std::to_string(p.bytes) + " bytes at slot offset " +
                                     std::to_string(p.src) + " outside the slot's " + std::to_string(slot_bytes_) +
                                     " bytes (or to no destination)");
  FLATKV_RETURN_IF_ERROR(backend_->EnqueueScatter(Slot(layer), pages));
  const uint64_t event = backend_->Record();
  if (event == 0)  // the backend could not record one (cudaEventCreate failed)
    return Status::IoError("gpu window: no event for the scatter of layer " + std::to_string(layer));
  scattered_[layer] = event;
  return event;
}

void GpuWindow::ReleaseLayer(uint32_t layer) {
  if (layer >= layers_ || state_[layer] == Layer::kReleased) return;
  // The slot's next layer may land by a file read or a decode, which do not
  // queue behind the scatter on the copy stream: the scatter reads the slot first.
  if (scattered_[layer] != 0) {
    const Status s = backend_->Wait(scattered_[layer]);  // its failure is the consumer's, who holds the event
    if (!s.ok()) LogWarning("gpu window: the scatter of layer " + std::to_string(layer) + ": " + s.ToString());
  }
  state_[layer] = Layer::kReleased;
  if (restore_) restore_->ReleaseLayer(layer);
}

uint32_t GpuWindow::Finish() {
  if (!restore_) return 0;
  const uint32_t valid = restore_->Finish();  // every layer landed (and its copies passed)
  (void)backend_->Wait(backend_->Record());
  return cancelled_.load() ? 0 : valid;
}

void GpuWindow::Cancel() { cancelled_.store(true); }

GpuWindowStats GpuWindow::Stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

}  // namespace flatkv::gpu
