// DramArena: the DRAM medium. One pre-faulted, 2 MiB aligned region of the
// configured capacity, carved into allocation units of `unit_bytes`; an
// extent (a DRAM home, or a DRAM copy of an SSD extent, laid out as its
// home) takes a run of consecutive units. Memory is touched once at
// creation and never returned (see shared/MACHINE.md).
//
// Thread-safety: the allocator is guarded by the store's lock; the bytes of
// a run are written by the one Put that reserved them and read only after
// that Put made them visible.
#pragma once

#include <cstdint>
#include <memory>

#include "common/aligned_buffer.h"
#include "flatkv/status.h"
#include "media/geometry.h"
#include "media/range_allocator.h"

namespace flatkv {

class DramArena {
 public:
  // `geometry`: the largest extent DRAM holds (a DRAM home's layout, sized
  // down for smaller homes); `unit_bytes` divides every extent it holds
  // into whole units (with SSD dirs: their allocation unit).
  static Result<std::unique_ptr<DramArena>> Create(uint64_t capacity_bytes, const ExtentGeometry& geometry,
                                                   uint64_t unit_bytes);

  const ExtentGeometry& geometry() const { return geometry_; }
  uint64_t unit_bytes() const { return unit_bytes_; }
  // Units an extent of `bytes` takes.
  uint64_t UnitsFor(uint64_t bytes) const { return (bytes + unit_bytes_ - 1) / unit_bytes_; }
  RangeAllocator& units() { return units_; }
  const RangeAllocator& units() const { return units_; }
  uint64_t capacity_bytes() const { return capacity_; }
  // Arena offset of a unit.
  uint64_t UnitOffset(uint64_t unit) const { return unit * unit_bytes_; }
  std::byte* At(uint64_t offset) { return buffer_.data() + offset; }
  const std::byte* At(uint64_t offset) const { return buffer_.data() + offset; }

 private:
  DramArena(uint64_t capacity, const ExtentGeometry& g, uint64_t unit_bytes, AlignedBuffer buffer)
      : capacity_(capacity), geometry_(g), unit_bytes_(unit_bytes), units_(capacity / unit_bytes),
        buffer_(std::move(buffer)) {}

  uint64_t capacity_;
  ExtentGeometry geometry_;
  uint64_t unit_bytes_;
  RangeAllocator units_;
  AlignedBuffer buffer_;
};

}  // namespace flatkv
