// ExtentGeometry: how blocks are laid out inside an extent on one medium.
//
// An extent holds `extent_blocks` consecutive blocks of one session,
// layer-major:
//
//   offset(layer l, block slot i) = l * layer_stride + i * slot_stride
//
// so one layer of a run of blocks is one contiguous byte range. An extent
// may hold fewer block slots than its medium's largest (Sized): it is
// sized to its session (docs/format_segment.md, "Sized extents"). On SSD,
// slot_stride is block_layer_bytes rounded up to 4 KiB so that every write
// and read is O_DIRECT-aligned; in DRAM it is block_layer_bytes exactly.
// Formulas and examples in docs/format_segment.md.
#pragma once

#include <cstdint>

#include "flatkv/shape.h"
#include "flatkv/status.h"

namespace flatkv {

struct ExtentGeometry {
  uint32_t layers = 0;
  uint64_t block_layer_bytes = 0;  // payload of one block in one layer
  uint64_t slot_stride = 0;        // >= block_layer_bytes
  uint32_t extent_blocks = 0;
  uint64_t layer_stride = 0;       // extent_blocks * slot_stride
  uint64_t extent_bytes = 0;       // layers * layer_stride

  uint64_t Offset(uint32_t layer, uint32_t slot) const { return layer * layer_stride + slot * slot_stride; }
  // The same layout for an extent of `blocks` block slots (a sized extent:
  // layer_stride and extent_bytes follow).
  ExtentGeometry Sized(uint32_t blocks) const {
    ExtentGeometry g = *this;
    g.extent_blocks = blocks;
    g.layer_stride = uint64_t{blocks} * slot_stride;
    g.extent_bytes = g.layer_stride * layers;
    return g;
  }
  // Bytes of one block slot over all layers: the allocation unit of sized extents.
  uint64_t BlockSlotBytes() const { return slot_stride * layers; }

  // Picks extent_blocks so that one layer's run is about `target_layer_bytes`,
  // and an extent fits in `max_extent_bytes`. `alignment` is 1 (DRAM) or 4096 (SSD).
  static Result<ExtentGeometry> Make(const KvShape& shape, uint32_t block_tokens, uint64_t target_layer_bytes,
                                     uint64_t max_extent_bytes, uint64_t alignment, const char* medium);
};

}  // namespace flatkv
