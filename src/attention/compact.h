// Compaction: a compacted KV keeps, per layer and KV head, only the selected
// token rows of a prompt's cache, with their original positions. Keys keep
// the RoPE of their original position, so attention over the kept entries
// is the dense attention restricted to them, and new tokens continue at the
// true positions prefix_len, prefix_len + 1, ...
//
// The reference transformer decodes from it through its attention hook
// (CompactedAttention): for a new token at position p, each query head
// attends over its KV head's kept entries then over the new tokens'
// positions prefix_len..p of the dense cache, reducing in exactly the
// reference order (model/fp_math.h). With nothing removed the kept entries
// are 0..prefix_len-1 in order, so outputs are bit-identical to dense.
//
// Store layout (docs/attention.md, "Compacted sessions"): metadata blocks
// (header, per-head counts, per-head positions) then slot blocks shaped like
// KvCache pages, padded per head with zero rows past its count.
//
// Thread-safety: CompactedKv is a plain value. A hook only reads it (several
// hooks may share one), but each hook keeps scratch, so like the
// Transformer it is set on, it serves one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "attention/budget.h"
#include "attention/scoring.h"
#include "flatkv/status.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/transformer.h"

namespace flatkv::attention {

struct CompactedKv {
  struct Head {
    std::vector<uint32_t> pos;  // ascending original positions, < prefix_len
    std::vector<float> k;       // pos.size() x head_dim, after RoPE
    std::vector<float> v;       // pos.size() x head_dim
  };
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  uint32_t prefix_len = 0;   // positions the compacted prompt covered; new tokens start here
  std::vector<Head> heads;   // [layer * n_kv_heads + kvh]

  Head& at(int layer, int h) { return heads[static_cast<size_t>(layer) * n_kv_heads + h]; }
  const Head& at(int layer, int h) const { return heads[static_cast<size_t>(layer) * n_kv_heads + h]; }
  uint64_t kept_entries() const;
  uint32_t max_count() const;  // the most entries any head keeps (the store's slot count)
  bool operator==(const CompactedKv& o) const;
};

// One layer of `cache`'s positions 0..n-1 as k[kvh][t][d] (and v), for scoring.
void GatherLayer(const model::KvCache& cache, int layer, int n_kv_heads, int head_dim, uint32_t n,
                 std::vector<float>& k, std::vector<float>& v);

// Keeps `sel[l][h]` (ascending indices < prefix_len) of cache positions.
[[nodiscard]] Result<CompactedKv> Compact(const model::KvCache& cache, const model::Config& c, uint32_t prefix_len,
                                          const Selection& sel);

// Everything a compaction run needs: a scorer, an allocator and its options,
// and the scorer's extra inputs (phases and probes are per layer: index l).
struct CompactOptions {
  const Scorer* scorer = nullptr;
  Allocator allocator = Allocator::kUniform;
  BudgetOptions budget;
  uint32_t window = 32;  // recent queries handed to the scorer as LayerKv::recent (more if it asks)
  std::vector<std::vector<QueryBlock>> phases;  // [layer] -> phase buffers (AgentKV)
  std::vector<QueryBlock> probes;               // [layer] -> probe queries (rehearsal)
};

// Scores and compacts a cache that holds `prefix_len` prompt positions whose
// queries are `queries` ([layer][h][t][d], as recorded by the transformer's
// query sink). H2O uses every query; the others see the last `window`, or
// the last Scorer::recent_queries() where that is more (SnapKV's window).
[[nodiscard]] Result<CompactedKv> ScoreAndCompact(const model::KvCache& cache, const model::Config& c,
                                                  uint32_t prefix_len, std::span<const float> queries,
                                                  const CompactOptions& o);

// The attention hook (model/transformer.h) over `ckv` plus the dense
// cache's positions >= ckv.prefix_len. `ckv` must outlive the hook.
model::Transformer::AttentionHook CompactedAttention(const CompactedKv& ckv, const model::Config& c);

// Store layout. Blocks of a compacted session: MetaBlocks() metadata blocks
// then ceil(max_count / block_tokens) slot blocks, each BlockBytes() =
// n_layers * 2 * block_tokens * kv_dim * 4 bytes (the Engine's store shape).
uint32_t CompactedBlocks(const CompactedKv& ckv, uint32_t block_tokens);
// The most blocks a compacted session of `prefix_len` positions can take.
uint32_t MaxCompactedBlocks(const model::Config& c, uint32_t prefix_len, uint32_t block_tokens);
// Put's layout (blocks back to back, each layer-slice major).
std::vector<std::byte> EncodeCompacted(const CompactedKv& ckv, uint32_t block_tokens);
// Parses `blocks` blocks; rejects a wrong magic, version, shape or count.
[[nodiscard]] Result<CompactedKv> DecodeCompacted(std::span<const std::byte> data, uint32_t blocks,
                                                  const model::Config& c, uint32_t block_tokens);

}  // namespace flatkv::attention
