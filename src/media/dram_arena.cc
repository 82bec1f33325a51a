#include "media/dram_arena.h"

namespace flatkv {

Result<std::unique_ptr<DramArena>> DramArena::Create(uint64_t capacity_bytes, const ExtentGeometry& geometry,
                                                     uint64_t unit_bytes) {
  if (capacity_bytes < geometry.extent_bytes)
    return Status::InvalidArgument("dram_capacity_bytes=" + std::to_string(capacity_bytes) +
                                   " is smaller than one DRAM extent (" + std::to_string(geometry.extent_bytes) + " bytes)");
  if (unit_bytes == 0) return Status::InvalidArgument("dram: allocation unit of 0 bytes");
  // Only whole units are ever used, so reserve exactly those, 2 MiB aligned.
  const uint64_t used = capacity_bytes / unit_bytes * unit_bytes;
  AlignedBuffer buffer(used, 2ull << 20);
  if (buffer.data() == nullptr)
    return Status::NoSpace("cannot allocate a DRAM arena of " + std::to_string(used) + " bytes");
  return std::unique_ptr<DramArena>(new DramArena(capacity_bytes, geometry, unit_bytes, std::move(buffer)));
}

}  // namespace flatkv
