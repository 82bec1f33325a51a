// DramArena: the DRAM medium. One pre-faulted, 2 MiB aligned region of the
// configured capacity, carved into fixed-size extent slots. Memory is
// touched once at creation and never returned (see shared/MACHINE.md).
//
// Thread-safety: the slot allocator is guarded by the store's lock; the
// bytes of a slot are written by the one Put that reserved them and read
// only after that Put made them visible.
#pragma once

#include <cstdint>
#include <memory>

#include "common/aligned_buffer.h"
#include "flatkv/status.h"
#include "media/geometry.h"
#include "media/slot_allocator.h"

namespace flatkv {

class DramArena {
 public:
  static Result<std::unique_ptr<DramArena>> Create(uint64_t capacity_bytes, const ExtentGeometry& geometry);

  const ExtentGeometry& geometry() const { return geometry_; }
  SlotAllocator& slots() { return slots_; }
  const SlotAllocator& slots() const { return slots_; }
  uint64_t capacity_bytes() const { return capacity_; }
  // Arena offset of an extent slot.
  uint64_t SlotOffset(uint64_t slot) const { return slot * geometry_.extent_bytes; }
  std::byte* At(uint64_t offset) { return buffer_.data() + offset; }

 private:
  DramArena(uint64_t capacity, const ExtentGeometry& g, AlignedBuffer buffer)
      : capacity_(capacity), geometry_(g), slots_(capacity / g.extent_bytes), buffer_(std::move(buffer)) {}

  uint64_t capacity_;
  ExtentGeometry geometry_;
  SlotAllocator slots_;
  AlignedBuffer buffer_;
};

}  // namespace flatkv
