#include "flatkv/placement.h"

namespace flatkv {

std::string_view MediumName(Medium m) {
  switch (m) {
    case Medium::kNone: return "none";
    case Medium::kDram: return "dram";
    case Medium::kSsd: return "ssd";
    case Medium::kRemote: return "remote";
  }
  return "unknown";
}

Placement DefaultPlacement::Choose(const PlacementContext& ctx) const {
  if (ctx.ssd_capacity_bytes == 0) return {Medium::kDram, false};
  if (ctx.dram_capacity_bytes == 0 || ctx.hint == PutHint::kOneShot) return {Medium::kSsd, false};
  if (ctx.hint == PutHint::kHot) return {Medium::kSsd, true};
  return {Medium::kSsd, ctx.session_dram_bytes + ctx.dram_extent_bytes <= ctx.session_share_bytes};
}

Placement FixedPlacement::Choose(const PlacementContext& ctx) const {
  if (medium_ == Medium::kDram && ctx.dram_capacity_bytes == 0) return {Medium::kSsd, false};
  if (medium_ == Medium::kSsd && ctx.ssd_capacity_bytes == 0) return {Medium::kDram, false};
  return {medium_, false};
}

}  // namespace flatkv
