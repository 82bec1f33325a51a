#include "gpu/gpu_window.h"

#include <algorithm>
#include <deque>

namespace flatkv::gpu {

Result<std::unique_ptr<GpuWindow>> GpuWindow::Start(CopyBackend* backend, std::unique_ptr<Restore> restore,
                                                    uint32_t layers, uint64_t block_layer_bytes, uint32_t slots) {
  if (backend == nullptr || restore == nullptr) return Status::InvalidArgument("gpu window: no backend or restore");
  if (layers == 0 || slots == 0 || block_layer_bytes == 0)
    return Status::InvalidArgument("gpu window: layers=" + std::to_string(layers) + " slots=" + std::to_string(slots) +
                                   " block_layer_bytes=" + std::to_string(block_layer_bytes) + " (each must be >= 1)");
  std::unique_ptr<GpuWindow> w(new GpuWindow(backend, std::move(restore), layers, block_layer_bytes, std::min(slots, layers)));
  if (w->hit_ > 0) {
    w->device_ = backend->AllocateDevice(uint64_t{w->slots_} * w->slot_bytes_);
    if (w->device_ == nullptr)
      return Status::NoSpace("gpu window: cannot allocate " + std::to_string(w->slots_) + " x " +
                             std::to_string(w->slot_bytes_) + " bytes of " + backend->name() + " device memory");
  }
  w->pump_ = std::thread([p = w.get()] { p->Pump(); });
  return w;
}

GpuWindow::GpuWindow(CopyBackend* backend, std::unique_ptr<Restore> restore, uint32_t layers, uint64_t block_layer_bytes,
                     uint32_t slots)
    : backend_(backend),
      restore_(std::move(restore)),
      layers_(layers),
      slots_(slots),
      hit_(restore_->hit_blocks()),
      slot_bytes_((uint64_t{hit_} * block_layer_bytes + 4095) / 4096 * 4096) {
  MutexLock lock(&mu_);
  state_.resize(layers_);
}

GpuWindow::~GpuWindow() {
  Cancel();
  if (pump_.joinable()) pump_.join();
  if (device_) {
    (void)backend_->Wait(backend_->Record());  // nothing may still write the slots (a failure was reported per layer)
    backend_->FreeDevice(device_);
  }
  for (const std::byte* p : registered_) backend_->UnregisterHost(p);  // before the store reuses or frees them
}

void GpuWindow::Pump() {
  // Copies queued whose host layer is not yet released (layer, its event), oldest first.
  std::deque<std::pair<uint32_t, uint64_t>> in_flight;
  auto release_host = [&](bool block) {
    while (!in_flight.empty()) {
      const auto [l, ev] = in_flight.front();
      if (!block && !backend_->Done(ev)) return;
      Status s = backend_->Wait(ev);
      restore_->ReleaseLayer(l);
      in_flight.pop_front();
      MutexLock lock(&mu_);
      if (!s.ok() && state_[l].status.ok()) state_[l].status = s;
      block = false;  // one blocking wait frees one host slot
    }
  };
  for (uint32_t l = 0; l < layers_ && hit_ > 0; ++l) {
    {  // The device slot is free once the consumer released layer l - slots.
      MutexLock lock(&mu_);
      if (l >= slots_ && !state_[l - slots_].released && !cancelled_) stats_.slot_waits++;
      while (l >= slots_ && !state_[l - slots_].released && !cancelled_) cv_.Wait(&mu_);
      if (cancelled_) break;
    }
    release_host(false);
    Result<LayerView> view = restore_->WaitLayer(l);
    while (!view.ok() && view.status().code() == Code::kFailedPrecondition && !in_flight.empty()) {
      // Beyond the restore's own window: free the oldest host layer first.
      {
        MutexLock lock(&mu_);
        stats_.host_waits++;
      }
      release_host(true);
      view = restore_->WaitLayer(l);
    }
    Status s = view.status();
    uint64_t ev = 0;
    // The host layer is pinned once per slot of the restore's window, so its
    // copy is DMA; where pinning fails the copy still runs, from pageable memory.
    if (s.ok() && !view->data.empty() &&
        std::find(registered_.begin(), registered_.end(), view->data.data()) == registered_.end()) {
      if (backend_->RegisterHost(view->data.data(), view->data.size()).ok()) {
        registered_.push_back(view->data.data());
      } else {
        MutexLock lock(&mu_);
        stats_.pageable_copies++;
      }
    }
    if (s.ok()) s = backend_->EnqueueCopy(Slot(l), view->data.data(), view->data.size());
    if (s.ok()) {
      ev = backend_->Record();
      in_flight.push_back({l, ev});
    } else if (view.ok()) {
      restore_->ReleaseLayer(l);  // nothing will read its host layer
    }
    MutexLock lock(&mu_);
    LayerState& st = state_[l];
    st.copied = true;
    st.event = ev;
    st.blocks = s.ok() ? view->blocks : 0;
    st.status = s;
    if (s.ok()) stats_.layers_copied++;
    cv_.SignalAll();
  }
  while (!in_flight.empty()) release_host(true);
  const uint32_t valid = restore_->Finish();
  MutexLock lock(&mu_);
  restore_valid_ = valid;
  pump_done_ = true;
  cv_.SignalAll();
}

Result<DeviceLayer> GpuWindow::WaitLayer(uint32_t layer) {
  if (layer >= layers_)
    return Status::InvalidArgument("gpu window: layer " + std::to_string(layer) + " of a " + std::to_string(layers_) +
                                   "-layer model");
  if (hit_ == 0) return DeviceLayer{layer, 0, nullptr};
  uint64_t ev;
  {
    MutexLock lock(&mu_);
    LayerState& st = state_[layer];
    if (st.released) return Status::FailedPrecondition("gpu window: layer " + std::to_string(layer) + " was already released");
    if (layer >= slots_ && !state_[layer - slots_].released)
      return Status::FailedPrecondition("gpu window: layer " + std::to_string(layer) + " is beyond the window of " +
                                        std::to_string(slots_) + " slots; release layer " +
                                        std::to_string(layer - slots_) + " first");
    while (!st.copied && !cancelled_) cv_.Wait(&mu_);
    if (!st.copied) return Status::Aborted("gpu window: cancelled before layer " + std::to_string(layer) + " was copied");
    if (!st.status.ok()) return st.status;
    ev = st.event;
  }
  Status s = backend_->Wait(ev);  // this layer's copy alone, not the pump's progress
  MutexLock lock(&mu_);
  LayerState& st = state_[layer];
  if (!s.ok() && st.status.ok()) st.status = s;
  if (!st.status.ok()) return st.status;
  return DeviceLayer{layer, st.blocks, Slot(layer)};
}

Result<uint64_t> GpuWindow::ScatterLayer(uint32_t layer, std::span<const PageCopy> pages) {
  if (layer >= layers_) return Status::InvalidArgument("gpu window: scatter of layer " + std::to_string(layer));
  for (const PageCopy& p : pages)
    if (p.src + p.bytes > slot_bytes_ || p.dst == nullptr)
      return Status::InvalidArgument("gpu window: a page copy of " + std::to_string(p.bytes) + " bytes at slot offset " +
                                     std::to_string(p.src) + " outside the slot's " + std::to_string(slot_bytes_) +
                                     " bytes (or to no destination)");
  {
    MutexLock lock(&mu_);
    const LayerState& st = state_[layer];
    if (!st.copied) return Status::FailedPrecondition("gpu window: scatter of layer " + std::to_string(layer) + " before WaitLayer");
    if (st.released) return Status::FailedPrecondition("gpu window: scatter of released layer " + std::to_string(layer));
    if (!st.status.ok()) return st.status;
  }
  FLATKV_RETURN_IF_ERROR(backend_->EnqueueScatter(Slot(layer), pages));
  return backend_->Record();
}

void GpuWindow::ReleaseLayer(uint32_t layer) {
  if (layer >= layers_) return;
  MutexLock lock(&mu_);
  state_[layer].released = true;
  cv_.SignalAll();
}

uint32_t GpuWindow::Finish() {
  if (hit_ == 0) return 0;
  bool failed = false;
  for (uint32_t l = 0; l < layers_; ++l) {
    {
      MutexLock lock(&mu_);
      if (state_[l].released && state_[l].copied) {
        failed = failed || !state_[l].status.ok();
        continue;
      }
    }
    failed = failed || !WaitLayer(l).ok();
    ReleaseLayer(l);
  }
  MutexLock lock(&mu_);
  while (!pump_done_) cv_.Wait(&mu_);
  return failed || cancelled_ ? 0 : restore_valid_;
}

void GpuWindow::Cancel() {
  MutexLock lock(&mu_);
  cancelled_ = true;
  cv_.SignalAll();
}

GpuWindowStats GpuWindow::Stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

}  // namespace flatkv::gpu
