// Scoring: how much each cached token of one layer matters, per KV head.
// Every selection method is a Scorer; every Scorer feeds the same budget
// allocators (attention/budget.h), which decide how many tokens each head
// keeps, and the kept tokens are the highest-scoring ones. A score of
// +infinity means "always keep" (sinks, the observation window), to the
// extent the head's budget allows.
//
// Layouts (the `flatkv dump-kv` layout, docs/format_kv_dump.md):
//   keys    k[kvh][t][d]   n_kv_heads x n_tokens x head_dim, after RoPE
//   values  v[kvh][t][d]
//   queries q[h][j][d]     n_heads x n_queries x head_dim, after RoPE; query j
//                          sits at position query_pos[j] and sees keys at
//                          positions <= query_pos[j] (causal)
//   key positions key_pos[t] (ascending); empty means 0..n_tokens-1.
// Query head h reads KV head h / (n_heads / n_kv_heads) (GQA); scorers that
// aggregate attention average it over the query heads of a group.
//
// Thread-safety: Scorers are immutable after construction; Score may run
// concurrently on different inputs.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "flatkv/status.h"

namespace flatkv::attention {

// A set of queries with their positions, q[h][j][d].
struct QueryBlock {
  std::span<const float> q;           // n_heads * positions.size() * head_dim
  std::span<const uint32_t> positions;  // one per query; UINT32_MAX = sees every key
};

// One layer's cache as a scorer sees it.
struct LayerKv {
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  uint32_t n_tokens = 0;
  std::span<const float> k;               // n_kv_heads * n_tokens * head_dim
  std::span<const float> v;               // same (may be empty for scorers that ignore values)
  std::span<const uint32_t> key_pos;      // n_tokens, or empty = 0..n_tokens-1
  QueryBlock recent;                      // the prompt's latest queries (observation window), or all

  uint32_t KeyPos(uint32_t t) const { return key_pos.empty() ? t : key_pos[t]; }
  int group() const { return n_heads / n_kv_heads; }
  Status Validate() const;
};

// Extra inputs some scorers need, supplied by the caller.
struct ScoreContext {
  int layer = 0;
  int n_layers = 1;
  // AgentKV: one small buffer of recent queries per agent phase (think, act,
  // tool, ...), in the order the caller names them.
  std::vector<QueryBlock> phases;
  // Rehearsal: probe queries (e.g. from question-answer pairs quoting the
  // context), positions UINT32_MAX (they come after the whole context).
  QueryBlock probes;
};

// scores[kvh][t], n_kv_heads x n_tokens; larger = more important.
struct HeadScores {
  int n_kv_heads = 0;
  uint32_t n_tokens = 0;
  std::vector<float> s;
  float* head(int h) { return s.data() + static_cast<size_t>(h) * n_tokens; }
  const float* head(int h) const { return s.data() + static_cast<size_t>(h) * n_tokens; }
};

class Scorer {
 public:
  virtual ~Scorer() = default;
  virtual std::string name() const = 0;
  // Whether the scorer wants every prompt query as LayerKv::recent (H2O's
  // accumulated attention) rather than the last window of them.
  virtual bool uses_all_queries() const { return false; }
  // How many of the prompt's latest queries it reads as `recent` (its
  // observation window); 0: whatever the caller hands it.
  virtual uint32_t recent_queries() const { return 0; }
  [[nodiscard]] virtual Result<HeadScores> Score(const LayerKv& kv, const ScoreContext& ctx) const = 0;
};

// StreamingLLM: `sinks` first tokens and then the most recent ones.
std::unique_ptr<Scorer> MakeStreamingScorer(uint32_t sinks = 4);
// H2O: attention accumulated over every query in `recent` (all prompt
// queries, causal), with the latest `recent_fraction` of tokens always kept.
std::unique_ptr<Scorer> MakeH2oScorer(double recent_fraction = 0.1);
// SnapKV: attention of the last `window` queries of `recent`, summed, then
// 1-D pooled with `kernel`; the window's own keys are always kept.
//   kMax  max pooling over every key (flatkv's default: window 32, kernel 7).
//   kAvg  average pooling over the keys before the window only, zero padded
//         and divided by `kernel` at the edges: F.avg_pool1d as NVIDIA
//         kvpress's SnapKVPress applies it (window 64, kernel 5 there).
enum class Pool { kMax, kAvg };
std::unique_ptr<Scorer> MakeSnapKvScorer(uint32_t window = 32, uint32_t kernel = 7, Pool pool = Pool::kMax);
// AgentKV-style: SnapKV scoring against each phase's query buffer
// (ctx.phases), each normalised to a distribution, combined by max (or mean)
// over phases; the `recent` window is scored as one more phase.
std::unique_ptr<Scorer> MakeAgentKvScorer(bool use_max = true, uint32_t kernel = 7);
// Rehearsal: mean attention of caller-supplied probe queries (ctx.probes),
// max pooled with `kernel`.
std::unique_ptr<Scorer> MakeRehearsalScorer(uint32_t kernel = 7);

// Building block shared by the scorers, exposed for tests:
// out[kvh][t] += mean over the group's query heads and over `queries` of
// softmax_t(q . k_t / sqrt(d)) (causal by position). `out` must be sized
// n_kv_heads * n_tokens.
void AccumulateAttention(const LayerKv& kv, const QueryBlock& queries, std::span<float> out);
// In place 1-D max pooling of each head's row with an odd `kernel` (same size).
void MaxPool(HeadScores& scores, uint32_t kernel);
// In place 1-D average pooling of the first `n` entries of each head's row
// with an odd `kernel`, zero padded (torch's avg_pool1d with padding
// kernel / 2 and count_include_pad); entries from `n` on are left alone.
void AvgPool(HeadScores& scores, uint32_t kernel, uint32_t n);

}  // namespace flatkv::attention
