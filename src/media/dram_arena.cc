#include "media/dram_arena.h"

namespace flatkv {

Result<std::unique_ptr<DramArena>> DramArena::Create(uint64_t capacity_bytes, const ExtentGeometry& geometry) {
  if (capacity_bytes < geometry.extent_bytes)
    return Status::InvalidArgument("dram_capacity_bytes=" + std::to_string(capacity_bytes) +
                                   " is smaller than one DRAM extent (" + std::to_string(geometry.extent_bytes) + " bytes)");
  // Only whole extents are ever used, so reserve exactly those, 2 MiB aligned.
  const uint64_t used = capacity_bytes / geometry.extent_bytes * geometry.extent_bytes;
  AlignedBuffer buffer(used, 2ull << 20);
  if (buffer.data() == nullptr)
    return Status::NoSpace("cannot allocate a DRAM arena of " + std::to_string(used) + " bytes");
  return std::unique_ptr<DramArena>(new DramArena(capacity_bytes, geometry, std::move(buffer)));
}

}  // namespace flatkv
