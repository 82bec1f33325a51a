// Self-speculative decoding with a selection-compressed drafter and RIFT's
// decode-time refresh (docs/attention.md, "Self-speculative decoding").
//
// One model plays both parts, as TriForce and MagicDec run it: the target is
// the model over the full KV cache; the drafter is the same model whose
// attention reads only a budget of `kv_budget` entries per (layer, KV head):
// a selection of earlier positions plus the `window` most recent ones. Both
// read one KvCache: positions the target has verified hold its exact KV; the
// drafter's guesses are written past them and overwritten by the next
// verification.
//
// A step: the drafter proposes gamma tokens one at a time (its attention
// hook); the target runs the last emitted token and the gamma drafts as one
// chunk and keeps the longest prefix of drafts equal to its own greedy
// tokens, plus its next token. The transformer's results do not depend on
// how tokens are chunked (model/transformer.h), so the output is
// bit-for-bit target-only greedy decoding.
//
// The selection: SnapKV scoring (attention/scoring.h) of every position
// before the frontier F by the target's queries of the last `obs_window`
// positions before F (recorded during verification), max-pooled, the top
// kv_budget - window positions per (layer, KV head). Selection at prefill
// (F = the prompt) goes stale as the output grows past the window ("decode
// staleness"): tokens generated since F and older than the window are in
// neither part. RIFT refreshes it during generation: every `refresh_every`
// tokens, or adaptively when the recent acceptance length drops.
//
// Thread-safety: one decoder, one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "flatkv/status.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/transformer.h"

namespace flatkv::engine {

enum class RefreshMode : uint8_t {
  kPrefillOnly,  // the selection made at prefill, never refreshed (the stale baseline)
  kEveryN,       // re-select every refresh_every emitted tokens
  kAdaptive,     // re-select when the last adaptive_steps steps' mean acceptance < adaptive_threshold x (gamma + 1)
};
std::string RefreshModeName(RefreshMode m);
Result<RefreshMode> ParseRefreshMode(const std::string& name);

struct SpeculativeOptions {
  uint32_t gamma = 4;            // drafted tokens per step (>= 1)
  uint32_t max_new_tokens = 64;  // tokens emitted (>= 1)
  uint32_t kv_budget = 0;        // drafter entries per (layer, KV head), window included; 0 = 25% of the prompt
  uint32_t window = 64;          // most recent positions always read (< kv_budget)
  uint32_t obs_window = 32;      // target queries scoring a selection (SnapKV's observation window)
  uint32_t pool_kernel = 7;      // SnapKV's max pooling
  RefreshMode refresh = RefreshMode::kEveryN;
  uint32_t refresh_every = 64;         // kEveryN: emitted tokens between refreshes
  uint32_t adaptive_steps = 4;         // kAdaptive: steps averaged
  float adaptive_threshold = 0.9f;     // kAdaptive: of gamma + 1
  uint32_t adaptive_min_tokens = 16;   // kAdaptive: tokens since the last selection before another
  bool stop_at_eos = false;
};

struct SpeculativeResult {
  std::vector<int> tokens;            // emitted, exactly max_new_tokens unless EOS
  uint64_t steps = 0;                 // draft + verify rounds
  uint64_t emitted_in_steps = 0;      // tokens the steps emitted (the first token comes from the prompt's logits)
  uint32_t refreshes = 0;             // selections after the prefill's
  uint64_t refresh_score_evals = 0;   // query . key products those selections computed
  uint64_t prefill_score_evals = 0;   // the prefill selection's
  uint32_t kv_budget = 0;
  double decode_ms = 0, draft_ms = 0, verify_ms = 0, refresh_ms = 0;
  std::vector<uint8_t> emitted_per_step;
  double acceptance_length() const { return steps ? double(emitted_in_steps) / double(steps) : 0; }
};

struct TargetResult {
  std::vector<int> tokens;
  double decode_ms = 0;
};

class SelfSpeculativeDecoder {
 public:
  // `max_positions`: prompt + output + gamma + 1 at least.
  SelfSpeculativeDecoder(const model::Model& m, uint32_t max_positions, int threads);
  ~SelfSpeculativeDecoder();

  // Prefills `prompt` over the full cache, recording the queries a
  // selection needs. Later Target/Speculative calls all continue from it.
  Status Prefill(std::span<const int> prompt);
  double prefill_ms() const { return prefill_ms_; }

  // Target-only greedy decoding of max_new_tokens tokens.
  Result<TargetResult> Target(uint32_t max_new_tokens, bool stop_at_eos);
  // Speculative decoding (greedy verification).
  Result<SpeculativeResult> Speculative(const SpeculativeOptions& o);

 private:
  struct Selection;
  void Select(uint32_t frontier, uint32_t keep, const SpeculativeOptions& o, uint64_t& evals);
  void DraftAttention(int layer, uint32_t pos0, uint32_t n, const float* q, const model::KvCache& cache, float* o);
  void RecordQuery(int layer, uint32_t pos, const float* q);

  const model::Model& model_;
  model::Transformer target_, drafter_;
  model::KvCache cache_;
  std::vector<int> prompt_;
  std::vector<float> prompt_logits_;
  double prefill_ms_ = 0;
  // Target queries of recent positions: [layer][slot][dim], slot = pos % ring_.
  uint32_t ring_ = 0;
  std::vector<float> queries_;
  std::vector<uint32_t> query_pos_;  // [layer][slot] position held, UINT32_MAX = none
  // The drafter's view: per (layer, KV head) ascending selected positions.
  std::vector<std::vector<uint32_t>> selected_;
  uint32_t window_ = 0;
  std::vector<float> scores_, x_, logits_;
};

}  // namespace flatkv::engine
