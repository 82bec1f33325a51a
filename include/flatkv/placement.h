// PlacementPolicy: picks the medium of an extent when it is created. A
// block never moves afterwards; placement is the only medium decision.
#pragma once

#include <cstdint>
#include <string_view>

namespace flatkv {

enum class Medium : uint8_t { kNone = 0, kDram = 1, kSsd = 2 };
std::string_view MediumName(Medium m);

// What a caller knows about the blocks it puts.
enum class PutHint : uint8_t {
  kAuto = 0,     // let the policy decide
  kOneShot = 1,  // unlikely to be reused soon: straight to SSD
  kHot = 2,      // reused soon: DRAM if the session's share allows
};

struct PlacementContext {
  uint64_t session = 0;
  PutHint hint = PutHint::kAuto;
  uint64_t session_dram_bytes = 0;   // DRAM extents the session holds now
  uint64_t session_share_bytes = 0;  // StoreOptions::session_dram_share_bytes
  uint64_t dram_extent_bytes = 0;    // size of one new DRAM extent
  uint64_t dram_capacity_bytes = 0;  // 0 when there is no DRAM tier
  uint64_t dram_free_bytes = 0;      // free now, without reclaiming
  uint64_t dram_reclaimable_bytes = 0;  // held by idle sessions
  uint64_t ssd_capacity_bytes = 0;   // 0 when there is no SSD tier
};

// Implementations must be thread-safe (called under the store's lock, so
// they must also be quick and must not call back into the store).
class PlacementPolicy {
 public:
  virtual ~PlacementPolicy() = default;
  virtual Medium Choose(const PlacementContext& ctx) const = 0;
  virtual std::string_view name() const = 0;
};

// The default: small, hot sessions stay in DRAM within their share; sessions
// that outgrow it, and one-shot blocks, go straight to SSD. DRAM is used
// only when free or reclaimable from idle sessions; otherwise SSD.
class DefaultPlacement final : public PlacementPolicy {
 public:
  Medium Choose(const PlacementContext& ctx) const override;
  std::string_view name() const override { return "default"; }
};

// Always one medium (for tests and benchmarks); falls back to the other
// medium only when the chosen one is absent.
class FixedPlacement final : public PlacementPolicy {
 public:
  explicit FixedPlacement(Medium m) : medium_(m) {}
  Medium Choose(const PlacementContext& ctx) const override;
  std::string_view name() const override { return medium_ == Medium::kDram ? "dram" : "ssd"; }

 private:
  Medium medium_;
};

}  // namespace flatkv
