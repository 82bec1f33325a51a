// The end-to-end protocol (docs/eval.md): what a lossy path (a codec round
// trip, a selection, a blend) does to a real model's output, by one method
// for every path and every peer.
//
// For one prompt (eval/workload.h) PromptEvaluator prefills the context with
// the exact cache once and keeps its KV. Evaluate(transform) copies that KV
// into a working cache, lets `transform` change positions [0, C) (C =
// context tokens), then:
//   - ppl: the continuation (256 tokens) teacher-forced in one pass from
//     position C-1: the last context token is fed again (recomputed from the
//     transformed cache, as an engine restoring a context always computes
//     its last token), then continuation[0..254]; its own KV is exact. The
//     256 log-probabilities of continuation[0..255] are summed (nll);
//     ppl = exp(nll / 256) and ppl_delta = ppl / ppl_full - 1, pooled over
//     prompts as exp((sum nll - sum nll_full) / sum tokens) - 1; also the
//     mean KL(full || transformed) over those positions;
//   - greedy_agreement: the 64 greedy tokens the exact cache gives after
//     the context (after the question for retrieval) are teacher-forced the
//     same way; the length of the prefix over which the transformed model's
//     argmax equals them is the common prefix a greedy decode would share
//     (identical inputs up to the first difference), divided by 64;
//   - retrieval: for a retrieval prompt, the question is fed after the
//     context and 8 tokens are decoded greedily; correct when the answer's
//     digits appear in their text.
// The context-helps filter: the continuation is also scored with no context
// at all (continuation[1..255] from continuation[0]) and against the same
// tokens with the full context; context_helps when the context lowers that
// perplexity by at least 10%. Perplexity goals are judged on those prompts.
//
// Thread-safety: a PromptEvaluator owns its caches and transformer; one
// thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "eval/workload.h"
#include "flatkv/status.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/transformer.h"

namespace flatkv::eval {

struct ProtocolOptions {
  uint32_t greedy_tokens = 64;
  uint32_t answer_tokens = 8;
  uint32_t block_tokens = 64;  // the caches' page size (the store's block)
  int threads = 0;             // the transformer's (0 = the machine's)
  // Optional: sees every context position's queries during the reference
  // prefill (tensor-level attention figures); not called otherwise.
  model::Transformer::QuerySink query_sink;
};

struct PromptResult {
  std::string id;
  PromptKind kind = PromptKind::kLong;
  uint32_t context_tokens = 0;
  // ppl (long, multidoc): summed NLL over `scored` continuation tokens.
  uint32_t scored = 0;
  double nll = 0, nll_full = 0;
  double kl_sum = 0;  // sum over scored positions of KL(full || this)
  // The context-helps filter (continuation[1..]: with the full context, with none).
  double filter_nll_context = 0, filter_nll_none = 0;
  uint32_t filter_scored = 0;
  // greedy agreement
  uint32_t greedy_common = 0, greedy_tokens = 0;
  // retrieval: -1 not a retrieval prompt, else 0 / 1
  int retrieval_correct = -1;
  std::string answer_text;  // what was decoded after the question

  double ppl() const;
  double ppl_full() const;
  double ppl_delta() const;  // ppl / ppl_full - 1
  double greedy_agreement() const;
  double kl() const;  // mean per scored token
  bool context_helps() const;  // ppl with context <= 0.9 x ppl without
};

// Gets the working cache holding the exact context KV at positions [0, C)
// (C = `context_tokens`) and changes it in place.
using KvTransform = std::function<Status(model::KvCache& cache, uint32_t context_tokens)>;
// Optional: prepares the transformer for the passes (an attention hook for
// a compacted KV, say); called before the passes, undone by the evaluator.
using TransformerSetup = std::function<void(model::Transformer& tf)>;

class PromptEvaluator {
 public:
  // Prefills the prompt's context and computes the exact-cache reference
  // (the greedy tokens, the full and no-context NLLs, the answer). With
  // `exact_context`, its positions [0, C) are taken as the context's exact
  // KV instead (a full prefill the caller ran anyway, an engine's say).
  static Result<std::unique_ptr<PromptEvaluator>> Create(const model::Model& model, const Prompt& prompt,
                                                         const ProtocolOptions& options,
                                                         const model::KvCache* exact_context = nullptr);

  const Prompt& prompt() const { return prompt_; }
  // The exact context KV (positions [0, C)).
  const model::KvCache& exact() const { return exact_; }
  // The exact cache's own result: ppl_delta 0, greedy agreement 1, its answer.
  const PromptResult& reference() const { return reference_; }
  // Wall time of the reference prefill of the context, ms.
  double prefill_ms() const { return prefill_ms_; }

  Result<PromptResult> Evaluate(const KvTransform& transform, const TransformerSetup& setup = nullptr);

 private:
  PromptEvaluator(const model::Model& model, const Prompt& prompt, const ProtocolOptions& options);
  Status Init(const model::KvCache* exact_context);
  // Feeds `tokens` at positions pos0.. into `cache`; returns their logits rows (n x vocab).
  std::vector<float> Pass(model::KvCache& cache, uint32_t pos0, std::span<const int> tokens);
  // Greedy decode of n tokens after `first` fed at pos0 (the first logits from that feed).
  std::vector<int> Greedy(model::KvCache& cache, uint32_t pos0, std::vector<int> feed, uint32_t n);
  Status Measure(model::KvCache& cache, PromptResult& r, bool reference);
  bool AnswerFound(const std::vector<int>& tokens) const;

  const model::Model& model_;
  Prompt prompt_;
  ProtocolOptions options_;
  model::Transformer tf_;
  model::KvCache exact_, work_;
  std::vector<int> greedy_ref_;                   // greedy tokens with the exact cache
  std::vector<std::vector<float>> ref_logp_;      // exact log-probs of the scored positions (for KL)
  PromptResult reference_;
  double prefill_ms_ = 0;
};

// Copies positions [0, n) of every layer from `from` to `to` (same config and block size).
void CopyPositions(const model::KvCache& from, model::KvCache& to, uint32_t n);

// ---- pooling over prompts ----

struct Summary {
  uint32_t prompts = 0;
  uint32_t ppl_prompts = 0;        // prompts scored for ppl that pass the context-helps filter
  uint32_t ppl_filtered_out = 0;   // scored prompts the filter left out
  double ppl_delta = 0;            // pooled over ppl_prompts
  double kl = 0;                   // mean per scored token over ppl_prompts
  double greedy_agreement = 0;     // mean over every prompt
  uint32_t retrieval_prompts = 0;
  double retrieval_accuracy = 0;   // mean over retrieval prompts (NaN when none)
  // 95% bootstrap intervals over prompts (2,000 resamples, fixed seed).
  double ppl_delta_lo = 0, ppl_delta_hi = 0;
  double greedy_lo = 0, greedy_hi = 0;
  double retrieval_lo = 0, retrieval_hi = 0;
};
Summary Summarize(const std::vector<PromptResult>& results);

// The pooled ppl_delta of a set of prompts (only those that pass the filter).
double PooledPplDelta(std::span<const PromptResult* const> results);

// A 95% percentile bootstrap interval of `stat` over `n` items: `stat` gets
// the resampled indices (with replacement). Deterministic for a seed.
struct Interval {
  double lo = 0, hi = 0;
};
Interval BootstrapInterval(size_t n, const std::function<double(std::span<const size_t>)>& stat, int resamples = 2000,
                           uint64_t seed = 1);

}  // namespace flatkv::eval
