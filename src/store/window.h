// RestoreWindow: the bounded destination of a restore. It has a fixed
// number of slots, each holding one layer of the restored prefix; layer l
// lands in slot l % slots() and the slot is recycled once the consumer
// releases the layer.
//
// HostWindow is pre-faulted host memory from the store's pool. Device
// memory is not a RestoreWindow: it is a RestoreTarget with a
// DeviceLanding (the GPU window, src/gpu/), for which this window is the
// pinned bounce buffer of the sources that cannot land there themselves.
// The I/O layer only needs slot() to be a host-addressable landing area,
// 4 KiB aligned.
// Thread-safety: slot memory is partitioned by layer; no internal locking.
#pragma once

#include <cstdint>

#include "common/aligned_buffer.h"

namespace flatkv {

class RestoreWindow {
 public:
  virtual ~RestoreWindow() = default;
  virtual uint32_t slots() const = 0;
  virtual uint64_t slot_bytes() const = 0;  // multiple of 4096
  virtual std::byte* slot(uint32_t i) = 0;  // 4096 aligned
};

class StoreImpl;

class HostWindow final : public RestoreWindow {
 public:
  HostWindow(StoreImpl* store, uint32_t slots, uint64_t slot_bytes);
  ~HostWindow() override;  // returns the buffer to the store's pool
  uint32_t slots() const override { return slots_; }
  uint64_t slot_bytes() const override { return slot_bytes_; }
  std::byte* slot(uint32_t i) override { return buffer_.data() + uint64_t{i} * slot_bytes_; }
  bool ok() const { return buffer_.data() != nullptr; }

 private:
  StoreImpl* store_;
  uint32_t slots_;
  uint64_t slot_bytes_;
  AlignedBuffer buffer_;
};

}  // namespace flatkv
