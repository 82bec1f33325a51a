#include "media/geometry.h"

#include <algorithm>

#include "common/aligned_buffer.h"

namespace flatkv {

Result<ExtentGeometry> ExtentGeometry::Make(const KvShape& shape, uint32_t block_tokens, uint64_t target_layer_bytes,
                                            uint64_t max_extent_bytes, uint64_t alignment, const char* medium) {
  ExtentGeometry g;
  g.layers = shape.layers;
  g.block_layer_bytes = shape.BytesPerTokenLayer() * block_tokens;
  g.slot_stride = RoundUp(g.block_layer_bytes, alignment);
  const uint64_t block_bytes = g.slot_stride * g.layers;
  const uint64_t fit = max_extent_bytes / block_bytes;
  if (fit == 0)
    return Status::InvalidArgument(std::string(medium) + ": " + std::to_string(max_extent_bytes) +
                                   " bytes cannot hold one block of " + std::to_string(block_bytes) + " bytes");
  uint64_t want = std::max<uint64_t>(1, (target_layer_bytes + g.slot_stride - 1) / g.slot_stride);
  g.extent_blocks = static_cast<uint32_t>(std::min<uint64_t>({want, fit, 65536}));
  g.layer_stride = uint64_t{g.extent_blocks} * g.slot_stride;
  g.extent_bytes = g.layer_stride * g.layers;
  return g;
}

}  // namespace flatkv
