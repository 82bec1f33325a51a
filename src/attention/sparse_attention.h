// Sparse decode attention inside a real model: Quest (attention/quest.h) and
// the certified sampler (attention/certified_sampler.h) as the transformer's
// attention step (model::Transformer::AttentionHook), so their effect on a
// model's output (perplexity, greedy agreement, retrieval) can be measured
// on real queries and keys, not only their per-step error on synthetic ones.
//
// The hook keeps an f16 mirror of every layer's cache (the layout the decode
// kernels read, docs/attention.md "Decode kernels over an f16 cache"), filled
// from the model's fp32 KvCache on first use of a layer (positions below the
// first new token) and extended row by row as new tokens arrive, with the
// index beside it (Quest's page min/max, the sampler's value norms) updated
// the same way, as an engine would. Each new token at position p is one
// decode step over positions 0..p (causal): Quest reads its top pages up to
// `token_budget` plus the newest page; the sampler reads every key and the
// values its certificate needs. Layers below `dense_layers` (Quest's recipe:
// 2) read everything (the dense kernel over the same f16 mirror).
//
// Counters (decode steps, tokens read, certificates and their violations
// against the exact f16 result when `check` is set) accumulate over calls.
//
// Thread-safety: one hook per transformer; not reentrant.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "attention/certified_sampler.h"
#include "attention/decode.h"
#include "attention/quest.h"
#include "flatkv/status.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/transformer.h"

namespace flatkv::attention {

enum class SparseMethod { kDense, kQuest, kSampler };

struct SparseAttentionOptions {
  SparseMethod method = SparseMethod::kQuest;
  uint32_t capacity = 0;          // positions the mirror holds (>= every position the hook sees)
  int dense_layers = 2;           // layers [0, dense_layers) read everything
  uint32_t page_tokens = 16;      // Quest
  uint32_t token_budget = 4096;   // Quest: tokens read per KV head per step
  SamplerOptions sampler;         // the sampler (seed advanced per step)
  bool check = false;             // compare every sparse step with exact decoding (double) of the same f16 cache
  int threads = 1;                // decode threads
};

struct SparseAttentionStats {
  uint64_t steps = 0;             // (token, layer) decode steps on the sparse path
  uint64_t tokens_read = 0;       // keys (Quest) or values (sampler) read, over KV/query heads
  uint64_t tokens_total = 0;      // what a dense step would have read, same unit
  uint64_t certified = 0, violated = 0, exact_fallbacks = 0;  // sampler, per query head (violations: check)
  double rel_err_sum = 0;         // check: sum over (step, query head) of the relative output error
  uint64_t rel_err_count = 0;
};

class SparseAttention {
 public:
  static Result<std::unique_ptr<SparseAttention>> Create(const model::Config& c, const SparseAttentionOptions& o);
  // The hook; `this` must outlive its use.
  model::Transformer::AttentionHook Hook();
  const SparseAttentionStats& stats() const { return stats_; }
  const Status& status() const { return status_; }  // the first decode error, if any (the hook cannot return one)

 private:
  SparseAttention(const model::Config& c, const SparseAttentionOptions& o);
  void Append(int layer, const model::KvCache& cache, uint32_t p);
  void Truncate(int layer, uint32_t pos);
  double RelErr(int h, int d) const;
  void Step(int layer, uint32_t p, const float* q, float* o);

  model::Config c_;
  SparseAttentionOptions o_;
  struct LayerMirror {
    uint32_t filled = 0;                 // positions [0, filled) mirrored
    std::vector<uint16_t> k, v;          // [kvh][capacity][d]
    std::vector<uint16_t> kmin, kmax;    // Quest: [kvh][page_capacity][d]
    std::vector<float> vnorm;            // sampler: [kvh][capacity]
  };
  std::vector<LayerMirror> layers_;
  QuestIndex qix_;                       // per-step views, reused
  SamplerIndex six_;
  std::vector<float> out_, exact_;
  std::vector<HeadCertificate> certs_;
  SparseAttentionStats stats_;
  Status status_;
};

}  // namespace flatkv::attention
