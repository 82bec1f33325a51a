// Engine: the reference serving engine. It runs a Model on the CPU and
// uses the Store exactly the way a serving engine would:
//
//   1. hash the prompt's full blocks into keys in the model's namespace
//      (model fingerprint, adapter, tenant);
//   2. restore the longest cached prefix layer by layer through the store's
//      straight into its KV pages, computing layer l of the first new tokens while later layers
//      are still loading;
//   3. prefill only the rest of the prompt, in chunks;
//   4. decode, then write every newly completed block back to the store
//      under the request's session.
//
// Reuse never changes an output: the kernels reduce in a fixed order
// whatever the chunking (model/transformer.h), and restored KV is the same
// bytes that were computed, so tokens and logits are bit-identical cold,
// warm from DRAM and warm from SSD.
//
// Thread-safety: an Engine serves one request at a time; use one per thread
// (the Store may be shared).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "attention/compact.h"
#include "flatkv/codec.h"
#include "flatkv/keys.h"
#include "flatkv/prune.h"
#include "flatkv/store.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/transformer.h"

namespace flatkv::engine {

struct EngineOptions {
  uint32_t block_tokens = 64;    // must equal the store's when a store is used
  uint32_t prefill_chunk = 64;   // tokens per prefill chunk (>= 1); results do not depend on it
  uint32_t max_context = 0;      // positions per request; 0 = the checkpoint's seq_len; may be larger
  std::string adapter_id;        // namespace: the adapter (empty = base model)
  std::string tenant_salt;       // namespace: the tenant
  HashKind hash = HashKind::kXxh3;
  std::string codec;             // this namespace's codec spec for new blocks ("pred:eps=0.02"); empty = the store's
  int threads = 0;               // the transformer's threads (model/transformer.h); 0 = the machine's; results do not depend on it
};

struct GenerateOptions {
  uint32_t max_new_tokens = 64;
  float temperature = 0.0f;  // 0 = greedy
  float top_p = 0.9f;
  uint64_t seed = 0;
  bool stop_at_eos = true;   // stop at the tokenizer's end of generation (EOS; llama2.c: BOS too)
  bool keep_logits = false;  // return the logits of every sampled step
};

struct Timing {
  double hash_lookup_ms = 0;  // key hashing and index lookup
  double restore_ms = 0;      // waiting for restored layers
  double prefill_ms = 0;      // computing the prompt's uncached tokens
  double first_decode_ms = 0; // final norm, classifier and sampling of the first token
  double ttft_ms = 0;         // all of the above, request start to first token
  double decode_ms = 0;       // every later token
  double put_ms = 0;          // writing new blocks to the store (after the response)
};

// A request's prune set (flatkv/prune.h): the view of the prompt's first
// `logical_blocks` blocks without the token positions in `ranges`.
struct PruneSpec {
  uint32_t logical_blocks = 0;
  std::vector<TokenRange> ranges;
};

// What one incremental compaction (ExtendCompacted) or one compaction from
// scratch cost, counted as query-key score evaluations (one q.k dot product
// of head_dim terms each), summed over layers and query heads.
struct CompactionWork {
  uint64_t score_evals = 0;    // the eviction method's scoring (its observation window against the candidates)
  uint64_t prefill_evals = 0;  // the attention of the tokens prefilled for it
  uint32_t candidates = 0;     // tokens per head the eviction method chose among (the last layer's)
  double prefill_ms = 0;       // wall time of that prefill
  double score_ms = 0;         // wall time of the scoring, allocation and gathering after it
};

// Next-token log-likelihood of a continuation (ScoreCompacted).
struct ContinuationNll {
  double nll_sum = 0;  // sum of -log p(next[i+1] | context, next[0..i])
  uint32_t count = 0;  // next.size() - 1
  double Perplexity() const;
};

struct GenerateResult {
  std::vector<int> tokens;                // sampled tokens (the end-of-generation token included when hit)
  std::vector<std::vector<float>> logits; // per sampled token, when keep_logits
  uint32_t prompt_tokens = 0;
  uint32_t restored_tokens_dram = 0;
  uint32_t restored_tokens_ssd = 0;
  uint32_t restored_tokens_remote = 0;    // from the remote tier (StoreOptions::remote)
  uint32_t computed_prompt_tokens = 0;    // prompt tokens run through the model
  uint32_t restored_pruned_tokens = 0;    // GeneratePruned: the kept tokens its pruned view restored
  uint32_t stored_blocks = 0;             // new blocks written to the store
  Timing timing;
};

// A prompt built from segments (engine_blend.cc, docs/blend.md): a prefix
// reused through chain keys as in Generate, reusable chunks (each found by
// its chunk keys wherever it sits), then a fresh tail (the question).
struct BlendPrompt {
  std::vector<int> prefix;               // may be empty
  std::vector<std::vector<int>> chunks;  // each non-empty
  std::vector<int> tail;                 // non-empty: its last token's logits come first
};

enum class BlendMode : uint8_t {
  kFull,   // baseline: prefill every token after the restored prefix (exact)
  kNaive,  // reuse every chunk's KV as stored, re-rotated; compute the tail only
  kBlend,  // CacheBlend: reuse, then recompute the chunk tokens whose KV deviates most
};

struct BlendOptions {
  BlendMode mode = BlendMode::kBlend;
  float recompute_ratio = 0.15f;  // fraction of chunk tokens recomputed past check_layer (0..1)
  uint32_t check_layer = 1;       // layers before it run every token; at it every token's K and V, then the selected
  float first_factor = 1.5f;      // check_layer keeps min(1, first_factor x ratio), check_layer+1 filters to ratio
  uint32_t score_tokens = 1;      // logits returned for the last score_tokens prompt positions (<= tail)
  bool store_chunks = true;       // prefill and store chunks not found in the store
};

struct BlendResult {
  std::vector<std::vector<float>> logits;  // score_tokens rows, positions N-score_tokens .. N-1
  uint32_t prompt_tokens = 0;
  uint32_t restored_prefix_tokens = 0;
  uint32_t reused_chunk_tokens = 0;      // chunk tokens whose KV came from the store
  uint32_t prefilled_chunk_tokens = 0;   // chunk tokens computed on their own (not cached) and stored
  uint64_t computed_token_layers = 0;    // (token, layer) pairs run, standalone chunk prefills included
  uint64_t kv_only_token_layers = 0;     // (token, layer) pairs of which only K and V were projected (check layer)
  double computed_fraction = 0;          // computed_token_layers / (prompt tokens x layers)
  std::vector<uint32_t> selected;        // chunk positions recomputed in every layer (kBlend)
  Timing timing;                         // ttft_ms: request start to the last position's logits
};

class Engine {
 public:
  // `store` may be null (no reuse). Fails when the store's shape or block
  // size does not match the model.
  static Result<Engine> Create(const model::Model& model, Store* store, const EngineOptions& options);

  // The store shape that holds this model's KV: one block's layer slice is
  // a KvCache page (K rows then V rows, fp32).
  static KvShape ShapeFor(const model::Config& config);

  // Runs one request for `session`: `prompt` is the whole context (history
  // included); returns the sampled continuation.
  Result<GenerateResult> Generate(SessionId session, std::span<const int> prompt, const GenerateOptions& options);

  // Mean negative log-likelihood of tokens[1..] given their prefixes, as
  // perplexity = exp(mean NLL); `tokens` longer than max_context are scored
  // in independent windows.
  Result<double> Perplexity(std::span<const int> tokens);

  // Compacted sessions (attention/compact.h, engine_compact.cc). Compact
  // prefills `prompt` from scratch, recording the queries, and keeps what
  // the options' scorer and allocator select. GenerateCompacted continues a
  // compacted prompt with `next` (>= 1 token, e.g. the new user turn) at
  // positions prefix_len.., then decodes; it stores nothing (the new tokens'
  // KV is not a dense prefix). PutCompacted/RestoreCompacted keep a
  // compacted prompt in the store as its own session, under keys derived
  // from the namespace, `tag` (say, the method and budget) and the prompt,
  // so it never collides with dense blocks.
  Result<attention::CompactedKv> Compact(std::span<const int> prompt, const attention::CompactOptions& options);
  Result<GenerateResult> GenerateCompacted(const attention::CompactedKv& ckv, std::span<const int> next,
                                           const GenerateOptions& options);
  Status PutCompacted(SessionId session, std::span<const int> prompt, const attention::CompactedKv& ckv,
                      const std::string& tag);
  Result<attention::CompactedKv> RestoreCompacted(std::span<const int> prompt, const std::string& tag);

  // Chain Cache (engine_chain.cc, docs/attention.md "Chain Cache"):
  // continues compacted KV `prev` (request n's) with request n+1's new turn
  // `turn` (positions prev.prefix_len..) and re-runs the eviction method over
  // the kept entries plus the turn's tokens only, never the whole history:
  // the turn is prefilled attending to prev's kept entries, its last
  // `o.window` queries score the candidates, and each head keeps
  // `keep_per_head` of them (uniform). `work` (optional) counts what it cost.
  Result<attention::CompactedKv> ExtendCompacted(const attention::CompactedKv& prev, std::span<const int> turn,
                                                 const attention::CompactOptions& o, uint32_t keep_per_head,
                                                 CompactionWork* work = nullptr);
  // The same compaction over the whole `prompt` (the "recompress every
  // turn" baseline): each head keeps keep_per_head. The dense KV of
  // prompt[0, cached) must be in this engine's cache already (the previous
  // call's prompt, as a full-reuse restore would give it; 0: prefill from
  // scratch); the rest is prefilled densely and the eviction method scores
  // the whole prompt. A scorer using every query (H2O) needs cached = 0.
  Result<attention::CompactedKv> CompactKeeping(std::span<const int> prompt, const attention::CompactOptions& o,
                                                uint32_t keep_per_head, CompactionWork* work = nullptr,
                                                uint32_t cached = 0);
  // Every position of `prompt` kept (dense KV as a CompactedKv: decoding
  // from it is bit-identical to dense); prefills `prompt` from scratch.
  Result<attention::CompactedKv> Uncompacted(std::span<const int> prompt);
  // Positions 0..n-1 of this engine's cache as they are (after a Generate of
  // an n-token prompt: its dense KV), every one kept.
  Result<attention::CompactedKv> CachedAsCompacted(uint32_t n) const;
  // The log-likelihood of `next` (>= 2 tokens) continuing `ckv`: next is
  // prefilled at positions ckv.prefix_len.. and each of next[score_from..]
  // (score_from >= 1) is scored by the logits before it. Stores nothing.
  Result<ContinuationNll> ScoreCompacted(const attention::CompactedKv& ckv, std::span<const int> next,
                                         uint32_t score_from = 1);

  // Prefix-cache pruning (engine_chain.cc): stores the pruned view of the
  // stored blocks of `history`'s first prune.logical_blocks blocks (all
  // must be stored; Store::Prune), with this namespace's codec.
  Result<PruneResult> PruneHistory(std::span<const int> history, const PruneSpec& prune);
  // Restores the pruned view of `prompt`'s first prune.logical_blocks blocks
  // as compacted KV: every head keeps the kept tokens' rows at their
  // original positions, prefix_len = logical_blocks x block_tokens. NotFound
  // when the view is not wholly stored.
  Result<attention::CompactedKv> RestorePruned(std::span<const int> prompt, const PruneSpec& prune);
  // A request naming a prune set: continues the restored view with the rest
  // of `prompt` and decodes (GenerateCompacted). Without the view it runs
  // the request dense (Generate), so it never fails for a missing view;
  // restored_pruned_tokens counts the view's kept tokens when it was used.
  Result<GenerateResult> GeneratePruned(SessionId session, std::span<const int> prompt, const PruneSpec& prune,
                                        const GenerateOptions& options);

  // Runs a segmented prompt to its first token's logits (no decode); see
  // BlendPrompt and BlendOptions. Chunks are stored under their chunk keys
  // (KeyHasher::ChunkKeys) in a session of their own, keys before RoPE.
  // The prefix's new full blocks are stored under `session` (after the logits).
  Result<BlendResult> Blend(SessionId session, const BlendPrompt& prompt, const BlendOptions& options);
  // The session a chunk is stored under: its first chunk key, top bit set.
  static SessionId ChunkSession(const BlockKey& first_chunk_key) { return flatkv::ChunkSession(first_chunk_key); }
  const model::KvCache& kv_cache() const { return cache_; }

  const BlockKey& namespace_digest() const { return ns_; }
  const EngineOptions& options() const { return options_; }
  model::Transformer& transformer() { return transformer_; }

 private:
  Engine(const model::Model& model, Store* store, const EngineOptions& options);
  // Restores up to `keys` into cache, overlapping the layer-major prefill of
  // the first chunk of new tokens; returns the positions now cached and
  // computed. Falls back to recomputing when restored blocks turn out bad.
  Result<uint32_t> RestoreAndPrefill(std::span<const int> prompt, std::span<const BlockKey> keys,
                                     GenerateResult& result, std::vector<float>& x);
  void PrefillChunk(std::span<const int> tokens, uint32_t pos0, std::vector<float>& x);
  std::vector<BlockKey> CompactedKeys(std::span<const int> prompt, const std::string& tag, uint32_t blocks) const;
  Status CheckTokens(std::span<const int> tokens, const char* what) const;
  // Prefills `tokens` at pos0.. and, when `queries` is given, records their
  // queries ([layer][h][t][d], t < tokens.size()) into it.
  void PrefillRecording(std::span<const int> tokens, uint32_t pos0, std::vector<float>& x, std::vector<float>* queries);
  // The chain keys of `tokens`' first `blocks` full blocks.
  std::vector<BlockKey> PrefixKeys(std::span<const int> tokens, uint32_t blocks) const;
  // Blend's parts (engine_blend.cc).
  uint32_t RestorePrefix(std::span<const int> prefix, BlendResult& result);
  Status LoadChunk(std::span<const int> chunk, uint32_t pos0, bool store_chunk, BlendResult& result);
  // Puts the full blocks of `context` from the end of what the store holds.
  Status PutNewBlocks(SessionId session, std::span<const int> context, GenerateResult& result);

  const model::Model* model_;
  Store* store_;
  EngineOptions options_;
  KeyHasher hasher_;
  BlockKey ns_;
  model::Transformer transformer_;
  model::KvCache cache_;
  std::shared_ptr<const Codec> codec_;  // from options_.codec; null = the store's
};

}  // namespace flatkv::engine
