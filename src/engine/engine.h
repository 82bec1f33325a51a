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

struct GenerateResult {
  std::vector<int> tokens;                // sampled tokens (the end-of-generation token included when hit)
  std::vector<std::vector<float>> logits; // per sampled token, when keep_logits
  uint32_t prompt_tokens = 0;
  uint32_t restored_tokens_dram = 0;
  uint32_t restored_tokens_ssd = 0;
  uint32_t restored_tokens_remote = 0;    // from the remote tier (StoreOptions::remote)
  uint32_t computed_prompt_tokens = 0;    // prompt tokens run through the model
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
