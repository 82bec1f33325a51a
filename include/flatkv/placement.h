// PlacementPolicy: decides, when an extent is created, where its blocks
// live. With an SSD tier every new extent's home is on SSD (written once,
// never moved) and the policy decides whether it also gets a DRAM *copy*;
// without one, DRAM is the only home. A home never moves afterwards; a copy
// may be dropped at any time without losing data (docs/architecture.md,
// "Placement and reclaim").
#pragma once

#include <cstdint>
#include <string_view>

namespace flatkv {

enum class Medium : uint8_t { kNone = 0, kDram = 1, kSsd = 2, kRemote = 3 };  // kRemote: the shared cluster (RemoteOptions)
std::string_view MediumName(Medium m);

// What a caller knows about the blocks it puts. Each value changes
// placement only where there is an SSD tier (without one, DRAM is the only
// home whatever the hint).
enum class PutHint : uint8_t {
  kAuto = 0,     // a DRAM copy while the session is within its DRAM share
  kOneShot = 1,  // unlikely to be reused soon: SSD home only, no DRAM copy
  kHot = 2,      // reused soon: a DRAM copy even past the session's share
                 // (still subject to DRAM capacity and reclaim)
};

struct PlacementContext {
  uint64_t session = 0;
  PutHint hint = PutHint::kAuto;
  uint64_t session_dram_bytes = 0;   // DRAM the session's extents (copies and DRAM homes) hold now
  uint64_t session_share_bytes = 0;  // the session's DRAM share (StoreOptions::session_dram_share_bytes, derived if 0)
  uint64_t dram_extent_bytes = 0;    // DRAM one new extent (or its copy) takes
  uint64_t dram_capacity_bytes = 0;  // 0 when there is no DRAM tier
  uint64_t dram_free_bytes = 0;      // free now, without reclaiming
  uint64_t ssd_capacity_bytes = 0;   // 0 when there is no SSD tier
};

// The decision for one new extent.
struct Placement {
  Medium home = Medium::kSsd;  // where the blocks live (kDram only for DRAM-only blocks)
  bool dram_copy = false;      // with an SSD home: also keep a DRAM copy
};

// Implementations must be thread-safe (called under the store's lock, so
// they must also be quick and must not call back into the store). The store
// corrects a decision the media cannot honour: a home on an absent medium
// moves to the other one, and a copy is made only with an SSD home, a DRAM
// tier, and a DRAM slot that is free or can be reclaimed from a copy.
class PlacementPolicy {
 public:
  virtual ~PlacementPolicy() = default;
  virtual Placement Choose(const PlacementContext& ctx) const = 0;
  virtual std::string_view name() const = 0;
};

// The default: with an SSD tier, an SSD home for every extent, and a DRAM
// copy unless the put is one-shot or (hint kAuto) the session's copies
// would exceed its share. Without an SSD tier, a DRAM home.
class DefaultPlacement final : public PlacementPolicy {
 public:
  Placement Choose(const PlacementContext& ctx) const override;
  std::string_view name() const override { return "default"; }
};

// Always one home and never a copy (for tests and benchmarks):
// FixedPlacement(kDram) makes DRAM-only blocks even beside an SSD tier,
// FixedPlacement(kSsd) SSD-only ones. Falls back to the other medium only
// when the chosen one is absent.
class FixedPlacement final : public PlacementPolicy {
 public:
  explicit FixedPlacement(Medium m) : medium_(m) {}
  Placement Choose(const PlacementContext& ctx) const override;
  std::string_view name() const override { return medium_ == Medium::kDram ? "dram" : "ssd"; }

 private:
  Medium medium_;
};

}  // namespace flatkv
