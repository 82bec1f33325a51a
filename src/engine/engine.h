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
};

struct GenerateOptions {
  uint32_t max_new_tokens = 64;
  float temperature = 0.0f;  // 0 = greedy
  float top_p = 0.9f;
  uint64_t seed = 0;
  bool stop_at_eos = true;
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
  std::vector<int> tokens;                // sampled tokens (EOS included when hit)
  std::vector<std::vector<float>> logits; // per sampled token, when keep_logits
  uint32_t prompt_tokens = 0;
  uint32_t restored_tokens_dram = 0;
  uint32_t restored_tokens_ssd = 0;
  uint32_t computed_prompt_tokens = 0;    // prompt tokens run through the model
  uint32_t stored_blocks = 0;             // new blocks written to the store
  Timing timing;
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
  Status PutNewBlocks(SessionId session, std::span<const int> context, uint32_t cached_blocks,
                      GenerateResult& result);

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
