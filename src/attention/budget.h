// Budget allocators: given every layer's head scores (attention/scoring.h)
// and a compression ratio, decide which tokens each KV head keeps.
//
// The budget follows NVIDIA kvpress: `ratio` is the fraction of tokens
// removed, so a head of n tokens keeps on average floor(n * (1 - ratio)), and
// the whole model keeps exactly n_layers * n_kv_heads * floor(n * (1 - ratio))
// entries whatever the allocator (allocators only move budget around).
//   uniform    every head of every layer keeps the same count.
//   pyramid    PyramidKV: layer budgets fall linearly with depth from
//              2k - k/beta to k/beta (k the mean), beta = 20; uniform within a layer.
//              With pyramid_window > 0, kvpress's PyramidKVPress rule as well:
//              the top budget is capped at n - window (the bottom one raised to
//              keep the mean), and the allocation falls back to uniform unless
//              n >= top >= bottom >= window.
//   adakv      Ada-KV: per layer, each head first keeps its alpha * k best
//              tokens (the safeguard, alpha = 0.5), then one top-k over all
//              heads' remaining scores fills the layer's budget H * k.
//   champion   ChampionKV-style: a head's dispersion is 1 / max_t of its
//              normalised scores (max aggregated observation-window
//              attention); budget goes to heads in proportion to it, above a
//              floor of floor_fraction * k; abnormal heads (max above
//              abnormal_max, e.g. all mass on a sink, or no finite scores)
//              get only the floor.
//   duo        streaming heads (DuoAttention, LServe): per layer, the half of
//              the heads whose finite scores put the most mass on the first
//              `duo_sinks` tokens keep only those sinks and the most recent
//              tokens (duo_recent in all, at most k); the other heads, the
//              retrieval heads, share the rest of the layer's budget H * k by
//              score, up to every token.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "attention/scoring.h"
#include "flatkv/status.h"

namespace flatkv::attention {

enum class Allocator { kUniform, kPyramid, kAdaKv, kChampion, kDuo };
std::string AllocatorName(Allocator a);
Result<Allocator> ParseAllocator(const std::string& name);

struct BudgetOptions {
  double ratio = 0.5;            // fraction of tokens removed, [0, 1)
  double pyramid_beta = 20;      // PyramidKV: deepest layer keeps k / beta
  uint32_t pyramid_window = 0;   // PyramidKV: kvpress's window_size rule (0: none)
  double ada_alpha = 0.5;        // Ada-KV safeguard: each head keeps >= alpha * k
  double champion_floor = 0.2;   // ChampionKV: each head keeps >= floor * k
  double champion_abnormal_max = 0.9;  // ChampionKV: max normalised score above this = abnormal head
  uint32_t duo_sinks = 4;        // streaming heads: sink tokens kept
  uint32_t duo_recent = 64;      // streaming heads: tokens kept in all (sinks + recent), capped at k
  double duo_fraction = 0.5;     // fraction of each layer's heads made streaming
};

// kept[layer][kvh]: ascending token indices into that layer's cache.
using Selection = std::vector<std::vector<std::vector<uint32_t>>>;

// Tokens kept per head on average: floor(n * (1 - ratio)) (with 1e-9 slack so
// that 100 * (1 - 0.8) gives 20), at least 1.
uint32_t KeepPerHead(uint32_t n_tokens, double ratio);

// Selects for every layer (scores[l], all with the same shape).
[[nodiscard]] Result<Selection> Allocate(Allocator a, std::span<const HeadScores> scores, const BudgetOptions& o);

// Splits `total` into integer counts, each in [floors[i], caps[i]], as close
// to proportional to weights above the floors as the caps allow; the counts
// sum to `total` when sum(floors) <= total <= sum(caps). Exposed for tests.
std::vector<uint32_t> Distribute(uint64_t total, std::span<const double> weights, std::span<const uint32_t> floors,
                                 std::span<const uint32_t> caps);

// The `count` highest-scoring token indices of one head, ascending (ties go
// to the later token).
std::vector<uint32_t> TopK(const float* scores, uint32_t n, uint32_t count);

}  // namespace flatkv::attention
