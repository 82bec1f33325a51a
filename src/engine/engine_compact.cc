// The Engine's compacted sessions: compaction of a prompt, decoding from a
// compacted KV, and storing/restoring one through the Store
// (attention/compact.h has the block layout, docs/attention.md the design).
#include <algorithm>
#include <cstring>

#include "engine/engine.h"
#include "engine/engine_hooks.h"

namespace flatkv::engine {

Status Engine::CheckTokens(std::span<const int> tokens, const char* what) const {
  if (tokens.empty()) return Status::InvalidArgument(std::string(what) + ": no tokens");
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= model_->config.vocab_size)
      return Status::InvalidArgument(std::string(what) + ": token " + std::to_string(i) + " is " +
                                     std::to_string(tokens[i]) + " (vocabulary has " +
                                     std::to_string(model_->config.vocab_size) + ")");
  return Status::Ok();
}

Result<attention::CompactedKv> Engine::Compact(std::span<const int> prompt, const attention::CompactOptions& options) {
  FLATKV_RETURN_IF_ERROR(CheckTokens(prompt, "compact"));
  const model::Config& c = model_->config;
  if (prompt.size() > options_.max_context)
    return Status::InvalidArgument("compact: prompt of " + std::to_string(prompt.size()) + " tokens exceeds max_context " +
                                   std::to_string(options_.max_context));
  const auto n = static_cast<uint32_t>(prompt.size());
  const size_t hs = c.head_size(), heads = c.n_heads;
  std::vector<float> queries(static_cast<size_t>(c.n_layers) * heads * n * hs);  // [layer][h][t][d]
  {
    QuerySinkGuard sink(transformer_, [&](int layer, uint32_t pos, const float* q) {
      if (pos >= n) return;
      for (size_t h = 0; h < heads; ++h)
        std::copy_n(q + h * hs, hs, queries.data() + ((static_cast<size_t>(layer) * heads + h) * n + pos) * hs);
    });
    std::vector<float> x;
    for (uint32_t pos = 0; pos < n; pos += options_.prefill_chunk) {
      const uint32_t m = std::min(options_.prefill_chunk, n - pos);
      PrefillChunk(prompt.subspan(pos, m), pos, x);
    }
  }
  return attention::ScoreAndCompact(cache_, c, n, queries, options);
}

Result<GenerateResult> Engine::GenerateCompacted(const attention::CompactedKv& ckv, std::span<const int> next,
                                                 const GenerateOptions& options) {
  const model::Config& c = model_->config;
  if (ckv.n_layers != c.n_layers || ckv.n_kv_heads != c.n_kv_heads || ckv.head_dim != c.head_size() ||
      ckv.heads.size() != static_cast<size_t>(c.n_layers) * c.n_kv_heads)
    return Status::InvalidArgument("generate-compacted: the compacted KV's shape (" + std::to_string(ckv.n_layers) +
                                   " layers, " + std::to_string(ckv.n_kv_heads) + " heads of " +
                                   std::to_string(ckv.head_dim) + ") does not match the model");
  FLATKV_RETURN_IF_ERROR(CheckTokens(next, "generate-compacted"));
  if (uint64_t{ckv.prefix_len} + next.size() + options.max_new_tokens > options_.max_context)
    return Status::InvalidArgument("generate-compacted: prefix " + std::to_string(ckv.prefix_len) + " + " +
                                   std::to_string(next.size()) + " tokens + " + std::to_string(options.max_new_tokens) +
                                   " new exceeds max_context " + std::to_string(options_.max_context));
  GenerateResult result;
  result.prompt_tokens = ckv.prefix_len + static_cast<uint32_t>(next.size());
  HookGuard hook(transformer_, attention::CompactedAttention(ckv, c));
  std::vector<float> x;
  uint32_t pos = ckv.prefix_len, last_n = 0;
  for (size_t i = 0; i < next.size();) {
    const uint32_t m = std::min<uint32_t>(options_.prefill_chunk, static_cast<uint32_t>(next.size() - i));
    PrefillChunk(next.subspan(i, m), pos, x);
    pos += m;
    i += m;
    last_n = m;
  }
  result.computed_prompt_tokens = static_cast<uint32_t>(next.size());
  std::vector<float> logits(c.vocab_size);
  transformer_.Logits(x.data() + size_t{last_n - 1} * c.dim, logits.data());
  model::Sampler sampler(c.vocab_size, options.temperature, options.top_p, options.seed);
  for (uint32_t i = 0; i < options.max_new_tokens; ++i) {
    const int token = sampler.Sample(logits);
    result.tokens.push_back(token);
    if (options.keep_logits) result.logits.push_back(logits);
    if (i + 1 == options.max_new_tokens) break;
    if (options.stop_at_eos && model_->tokenizer && model_->tokenizer->IsEndOfGeneration(token)) break;
    const int fed[1] = {token};
    transformer_.Forward(fed, pos++, cache_, logits.data());
  }
  return result;
}

std::vector<BlockKey> Engine::CompactedKeys(std::span<const int> prompt, const std::string& tag, uint32_t blocks) const {
  // Root: a namespace of its own (the adapter field carries the tag), then
  // the whole prompt as one link; blocks chain one synthetic token each.
  const BlockKey ns = hasher_.NamespaceDigest(
      {model_->fingerprint, options_.adapter_id + "\x1f" "compacted\x1f" + tag, options_.tenant_salt});
  const std::vector<uint32_t> tokens(prompt.begin(), prompt.end());
  const BlockKey root = hasher_.Chain(ns, tokens);
  std::vector<uint32_t> index(blocks);
  for (uint32_t i = 0; i < blocks; ++i) index[i] = i;
  return hasher_.ChainKeys(root, index, 1);
}

Status Engine::PutCompacted(SessionId session, std::span<const int> prompt, const attention::CompactedKv& ckv,
                            const std::string& tag) {
  if (store_ == nullptr) return Status::FailedPrecondition("put-compacted: the engine has no store");
  FLATKV_RETURN_IF_ERROR(CheckTokens(prompt, "put-compacted"));
  if (ckv.prefix_len != prompt.size())
    return Status::InvalidArgument("put-compacted: compacted KV covers " + std::to_string(ckv.prefix_len) +
                                   " positions, prompt has " + std::to_string(prompt.size()));
  const model::Config& c = model_->config;
  if (ckv.n_layers != c.n_layers || ckv.n_kv_heads != c.n_kv_heads || ckv.head_dim != c.head_size())
    return Status::InvalidArgument("put-compacted: the compacted KV's shape does not match the model");
  const uint32_t blocks = attention::CompactedBlocks(ckv, options_.block_tokens);
  const std::vector<std::byte> data = attention::EncodeCompacted(ckv, options_.block_tokens);
  return store_->Put(session, CompactedKeys(prompt, tag, blocks), data);
}

Result<attention::CompactedKv> Engine::RestoreCompacted(std::span<const int> prompt, const std::string& tag) {
  if (store_ == nullptr) return Status::FailedPrecondition("restore-compacted: the engine has no store");
  FLATKV_RETURN_IF_ERROR(CheckTokens(prompt, "restore-compacted"));
  const model::Config& c = model_->config;
  const uint32_t bt = options_.block_tokens;
  const auto keys = CompactedKeys(
      prompt, tag, attention::MaxCompactedBlocks(c, static_cast<uint32_t>(prompt.size()), bt));
  FLATKV_ASSIGN_OR_RETURN(auto restore, store_->StartRestore(keys));
  const uint32_t hit = restore->hit_blocks();
  if (hit == 0) return Status::NotFound("restore-compacted: no compacted session '" + tag + "' for this prompt");
  const uint64_t slice = store_->BlockLayerBytes();
  std::vector<std::byte> data(uint64_t{hit} * c.n_layers * slice);  // Put's layout: block-major
  for (int l = 0; l < c.n_layers; ++l) {
    FLATKV_ASSIGN_OR_RETURN(LayerView view, restore->WaitLayer(static_cast<uint32_t>(l)));
    if (view.blocks != hit) {
      restore->ReleaseLayer(static_cast<uint32_t>(l));
      return Status::Corruption("restore-compacted: layer " + std::to_string(l) + " restored " +
                                std::to_string(view.blocks) + " of " + std::to_string(hit) + " blocks");
    }
    for (uint32_t b = 0; b < hit; ++b)
      std::memcpy(data.data() + (uint64_t{b} * c.n_layers + l) * slice, view.data.data() + uint64_t{b} * slice, slice);
    restore->ReleaseLayer(static_cast<uint32_t>(l));
  }
  if (restore->Finish() != hit) return Status::Corruption("restore-compacted: blocks lost while loading");
  return attention::DecodeCompacted(data, hit, c, bt);
}

}  // namespace flatkv::engine
