#include "flatkv/placement.h"

namespace flatkv {

std::string_view MediumName(Medium m) {
  switch (m) {
    case Medium::kNone: return "none";
    case Medium::kDram: return "dram";
    case Medium::kSsd: return "ssd";
  }
  return "unknown";
}

Medium DefaultPlacement::Choose(const PlacementContext& ctx) const {
  if (ctx.dram_capacity_bytes == 0) return Medium::kSsd;
  if (ctx.ssd_capacity_bytes == 0) return Medium::kDram;
  if (ctx.hint == PutHint::kOneShot) return Medium::kSsd;
  if (ctx.session_dram_bytes + ctx.dram_extent_bytes > ctx.session_share_bytes) return Medium::kSsd;
  if (ctx.dram_free_bytes + ctx.dram_reclaimable_bytes >= ctx.dram_extent_bytes) return Medium::kDram;
  return Medium::kSsd;
}

Medium FixedPlacement::Choose(const PlacementContext& ctx) const {
  if (medium_ == Medium::kDram && ctx.dram_capacity_bytes == 0) return Medium::kSsd;
  if (medium_ == Medium::kSsd && ctx.ssd_capacity_bytes == 0) return Medium::kDram;
  return medium_;
}

}  // namespace flatkv
