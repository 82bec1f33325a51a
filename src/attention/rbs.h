// RBS-Attention: training-free block-sparse prefill (docs/attention.md,
// "Sparse prefill"). Keys are cut into blocks of `block` positions; each key
// block keeps its centroid c_j (mean key) and its maximum radius
// r_j = max_t ||k_t - c_j||. For a query block (the rows of `block`
// consecutive positions) two branches pick key blocks, each with its own
// threshold:
//
//   base branch    every row r estimates block j's logit mass from the
//                  centroid, s_rj = scale * q_r . c_j + log n_j (n_j keys);
//                  softmax over the causal blocks, averaged over the rows,
//                  gives each block's estimated share of the attention; the
//                  base branch keeps the fewest blocks whose shares reach
//                  `base_mass`.
//   rescue branch  a block whose centroid hides one relevant key ("mean
//                  dilution") scores low in the base branch: one key of logit
//                  s among n_j contributes only about s - log n_j to the
//                  centroid's logit. The key that sets a block's maximum
//                  radius r_j = max_t ||k_t - c_j|| is the one the centroid
//                  represents worst, so each block keeps it (f_j) beside its
//                  centroid; the rescue branch scores it exactly,
//                  u_rj = scale * q_r . f_j, and keeps block j when
//                  exp(u_rj - L_r) >= `rescue_share` for some row, L_r the
//                  row's estimated log-partition (logsumexp_j s_rj): when the
//                  block's outlying key alone would take that share of the
//                  row. Which blocks have outliers, and how far out, is the
//                  prompt's, layer's and head's own key distribution.
//
// The two masks are OR-ed per (query block, query head), plus the diagonal
// block (causality needs it; `local_blocks` extends it backwards) and block
// 0 (the attention sinks): a list of
// whole key blocks, so execution stays regular block-sparse
// (attention/rbs_kernels.h runs it).
//
// Thread-safety: the functions are pure; an RbsPrefill (the transformer's
// attention hook) keeps per-layer statistics and scratch: one per
// Transformer, one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "attention/rbs_kernels.h"
#include "common/cpu.h"
#include "flatkv/status.h"
#include "model/model.h"
#include "model/transformer.h"

namespace flatkv {
class ThreadPool;
}

namespace flatkv::attention {

enum class RbsMode : uint8_t {
  kDense,        // every causal block (the reference; the kernel is the same)
  kRbs,          // base branch OR rescue branch (the method)
  kBaseOnly,     // the base branch alone at the same base_mass (rescue off)
  kBaseMatched,  // the base branch alone, as many blocks per (query block, head) as kRbs picks: rescue off at equal density
};

struct RbsOptions {
  uint32_t block = 64;        // positions per query block and per key block (>= 1)
  float base_mass = 0.9f;     // base branch: estimated attention share to cover, (0, 1]
  float rescue_share = 0.05f; // rescue branch: a key's bounded share of a row that rescues its block, > 0
  RbsMode mode = RbsMode::kRbs;
  bool keep_first = true;     // always compute key block 0 (attention sinks)
  uint32_t local_blocks = 1;  // always compute the diagonal block and the local_blocks - 1 before it (>= 1)
  Status Validate() const;
};

// One KV head's key blocks.
struct KeyBlockStats {
  int d = 0;
  uint32_t block = 0;
  uint32_t n_keys = 0;
  std::vector<float> centroid;  // blocks x d
  std::vector<float> radius;    // blocks
  std::vector<float> far;       // blocks x d: each block's key at distance radius from its centroid
  uint32_t blocks() const { return static_cast<uint32_t>(radius.size()); }
};

// (Re)computes the stats of keys 0..n_keys-1 of `k`, keeping the blocks
// that were already complete in `s` (keys only ever get appended).
void UpdateKeyBlockStats(const BlockRows& k, uint32_t n_keys, int d, uint32_t block, KeyBlockStats& s);

struct MaskCounts {
  uint64_t causal = 0;    // causal key blocks of the query blocks seen
  uint64_t selected = 0;  // blocks computed
  uint64_t base = 0;      // picked by the base branch
  uint64_t rescued = 0;   // picked by the rescue branch and not by the base branch
  uint64_t forced = 0;    // diagonal / first block picked by neither branch
  void Add(const MaskCounts& o);
};

struct MaskScratch {
  std::vector<float> s, u, mass, rescue;
  std::vector<uint32_t> order;
  std::vector<uint8_t> pick;
};

// The key blocks one query block computes. Rows r < rows at ascending
// positions pos[r] within one query block (pos[r] / block equal); queries at
// q + r * q_stride (d floats, after RoPE). `stats` must cover every key at
// positions <= pos[rows - 1]. Writes ascending block ids to `out`.
void SelectBlocks(const float* q, uint64_t q_stride, const uint32_t* pos, uint32_t rows, const KeyBlockStats& stats,
                  const RbsOptions& o, float scale, const RbsKernels& kernels, MaskScratch& scratch,
                  std::vector<uint32_t>& out, MaskCounts& counts);

// What a prefill under RbsPrefill computed; figures summed over calls.
struct RbsRunStats {
  MaskCounts mask;
  double mask_s = 0;    // thread-seconds selecting blocks (centroid stats included)
  double sparse_s = 0;  // thread-seconds in the block-sparse kernel
  double dense_s = 0;   // thread-seconds of the dense reference (measure_dense)
  // With measure_dense: per row exp(lse_sparse - lse_dense), summed; and the
  // output error sum ||o_sparse - o_dense||^2 over sum ||o_dense||^2.
  double retention_sum = 0;
  uint64_t rows = 0;
  double err2 = 0, ref2 = 0;
  double density() const { return mask.causal ? double(mask.selected) / double(mask.causal) : 0; }
  double retention() const { return rows ? retention_sum / double(rows) : 0; }
  double rel_error() const;
  double speedup() const;  // dense_s / (mask_s + sparse_s)
};

// The transformer's attention hook (model/transformer.h) running RBS
// block-sparse attention over the KvCache, whose block_tokens must equal
// options.block. With measure_dense, every call also runs the dense
// reference on the same rows (timed apart; its output is not used), to
// report retention, output error and the attention speedup.
class RbsPrefill {
 public:
  static Result<std::unique_ptr<RbsPrefill>> Create(const model::Config& c, const RbsOptions& o, uint32_t cache_block_tokens,
                                                    int threads, bool measure_dense, SimdLevel simd = DetectedSimd());
  ~RbsPrefill();
  model::Transformer::AttentionHook Hook();
  const RbsRunStats& stats() const { return stats_; }
  void ResetStats() { stats_ = {}; }

 private:
  RbsPrefill(const model::Config& c, const RbsOptions& o, int threads, bool measure_dense, SimdLevel simd);
  void Run(int layer, uint32_t pos0, uint32_t n, const float* q, const model::KvCache& cache, float* o);

  model::Config config_;
  RbsOptions options_;
  bool measure_dense_;
  const RbsKernels* kernels_;
  std::unique_ptr<ThreadPool> pool_;
  std::vector<KeyBlockStats> key_stats_;  // [layer * n_kv_heads + kvh]
  struct PerThread {
    MaskScratch mask;
    BlockAttendScratch attend;
    std::vector<uint32_t> blocks, all;
    std::vector<float> lse, dense_o, dense_lse;
    RbsRunStats stats;
  };
  std::vector<PerThread> threads_;
  RbsRunStats stats_;
};

}  // namespace flatkv::attention
