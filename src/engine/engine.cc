#include "engine/engine.h"

#include <chrono>
#include <cmath>
#include <cstring>

#include "common/log.h"

namespace flatkv::engine {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<uint32_t> AsTokens(std::span<const int> tokens) { return {tokens.begin(), tokens.end()}; }

double MsSince(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

}  // namespace

KvShape Engine::ShapeFor(const model::Config& c) {
  return KvShape::Mha(static_cast<uint32_t>(c.n_layers), static_cast<uint32_t>(c.n_kv_heads),
                      static_cast<uint32_t>(c.head_size()), DType::kF32);
}

Result<Engine> Engine::Create(const model::Model& model, Store* store, const EngineOptions& options) {
  FLATKV_RETURN_IF_ERROR(model.config.Validate());
  EngineOptions o = options;
  if (o.block_tokens < 16 || o.block_tokens > 512)
    return Status::InvalidArgument("engine: block_tokens=" + std::to_string(o.block_tokens) + " (expected 16..512)");
  if (o.prefill_chunk == 0) return Status::InvalidArgument("engine: prefill_chunk=0 (expected >= 1)");
  if (o.threads < 0) return Status::InvalidArgument("engine: threads=" + std::to_string(o.threads) + " (expected >= 0)");
  if (o.max_context == 0) o.max_context = static_cast<uint32_t>(model.config.seq_len);
  if (o.max_context > (1u << 24)) return Status::InvalidArgument("engine: max_context=" + std::to_string(o.max_context) + " is too large");
  if (store != nullptr) {
    const StoreOptions& so = store->options();
    if (so.block_tokens != o.block_tokens)
      return Status::InvalidArgument("engine: block_tokens=" + std::to_string(o.block_tokens) + " but the store's is " +
                                     std::to_string(so.block_tokens));
    if (!(so.shape == ShapeFor(model.config)))
      return Status::InvalidArgument("engine: the store holds {" + so.shape.ToString() + "} but the model needs {" +
                                     ShapeFor(model.config).ToString() + "}");
  }
  Engine engine(model, store, o);
  if (!o.codec.empty()) {
    auto codec = MakeCodec(o.codec);
    if (!codec.ok()) return codec.status().WithContext("engine: codec");
    FLATKV_RETURN_IF_ERROR(codec.value()->Supports({ShapeFor(model.config), o.block_tokens}).WithContext("engine: codec " + o.codec));
    engine.codec_ = std::move(codec).value();
  }
  return engine;
}

Engine::Engine(const model::Model& model, Store* store, const EngineOptions& options)
    : model_(&model),
      store_(store),
      options_(options),
      hasher_(options.hash),
      ns_(hasher_.NamespaceDigest({model.fingerprint, options.adapter_id, options.tenant_salt})),
      transformer_(model, model::TransformerOptions{.threads = options.threads, .simd = std::nullopt}),
      cache_(model.config, options.block_tokens, options.max_context) {}

void Engine::PrefillChunk(std::span<const int> tokens, uint32_t pos0, std::vector<float>& x) {
  x.resize(tokens.size() * static_cast<size_t>(model_->config.dim));
  transformer_.Embed(tokens, x.data());
  for (int l = 0; l < model_->config.n_layers; ++l)
    transformer_.Layer(l, pos0, static_cast<uint32_t>(tokens.size()), x.data(), cache_);
}

Result<uint32_t> Engine::RestoreAndPrefill(std::span<const int> prompt, std::span<const BlockKey> keys,
                                           GenerateResult& result, std::vector<float>& x) {
  const uint32_t bt = options_.block_tokens;
  const int layers = model_->config.n_layers;
  // A second attempt follows a restore that lost blocks to a failed check:
  // the bad block has left the index, so the retry hits a shorter prefix.
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto t = Clock::now();
    // Blocks land straight in the cache's pages; SSD reads go there directly
    // when a layer's pages are contiguous and aligned.
    RestoreTarget target;
    target.destination = [this](uint32_t l, uint32_t b) { return cache_.PageBytes(static_cast<int>(l), b).data(); };
    auto started = store_->StartRestore(keys, target);
    result.timing.hash_lookup_ms += MsSince(t);
    if (!started.ok()) {
      LogWarning("engine: restore failed, recomputing: " + started.status().ToString());
      return 0u;
    }
    Restore& restore = *started.value();
    const uint32_t hit = restore.hit_blocks();
    if (hit == 0) return 0u;
    const uint32_t cached = hit * bt;
    const uint32_t n = std::min<uint32_t>(options_.prefill_chunk, static_cast<uint32_t>(prompt.size()) - cached);
    const auto chunk = prompt.subspan(cached, n);
    x.resize(size_t{n} * model_->config.dim);
    auto tc = Clock::now();
    transformer_.Embed(chunk, x.data());
    result.timing.prefill_ms += MsSince(tc);
    bool complete = true;
    for (int l = 0; l < layers && complete; ++l) {
      auto tw = Clock::now();
      auto view = restore.WaitLayer(static_cast<uint32_t>(l));
      complete = view.ok() && view->blocks == hit;
      restore.ReleaseLayer(static_cast<uint32_t>(l));
      result.timing.restore_ms += MsSince(tw);
      if (!complete) break;
      // Layer l of the new tokens runs while layers l+1.. are still loading.
      tc = Clock::now();
      transformer_.Layer(l, cached, n, x.data(), cache_);
      result.timing.prefill_ms += MsSince(tc);
    }
    if (!complete || restore.Finish() != hit) {
      LogWarning("engine: restored prefix lost blocks while loading; restoring again");
      continue;
    }
    for (uint32_t b = 0; b < hit; ++b) {
      const Medium m = restore.locations()[b].layer0.medium();
      (m == Medium::kDram ? result.restored_tokens_dram
                          : m == Medium::kRemote ? result.restored_tokens_remote : result.restored_tokens_ssd) += bt;
    }
    result.computed_prompt_tokens += n;
    return cached + n;
  }
  return 0u;
}

Result<GenerateResult> Engine::Generate(SessionId session, std::span<const int> prompt, const GenerateOptions& options) {
  const auto start = Clock::now();
  const model::Config& c = model_->config;
  if (prompt.empty()) return Status::InvalidArgument("generate: the prompt is empty");
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= c.vocab_size)
      return Status::InvalidArgument("generate: prompt token " + std::to_string(i) + " is " + std::to_string(prompt[i]) +
                                     " (vocabulary has " + std::to_string(c.vocab_size) + ")");
  if (prompt.size() + options.max_new_tokens > options_.max_context)
    return Status::InvalidArgument("generate: a prompt of " + std::to_string(prompt.size()) + " tokens plus " +
                                   std::to_string(options.max_new_tokens) + " new tokens exceeds max_context " +
                                   std::to_string(options_.max_context));
  GenerateResult result;
  result.prompt_tokens = static_cast<uint32_t>(prompt.size());
  const uint32_t bt = options_.block_tokens;
  std::vector<float> x;
  uint32_t pos = 0;  // prompt positions cached or computed so far
  if (store_ != nullptr) {
    // At most len-1 tokens are reused, so the last prompt token is computed
    // and its logits give the first output token.
    auto t = Clock::now();
    const uint32_t reusable = (static_cast<uint32_t>(prompt.size()) - 1) / bt;
    auto keys = hasher_.ChainKeys(ns_, AsTokens(prompt.first(size_t{reusable} * bt)), bt);
    result.timing.hash_lookup_ms += MsSince(t);
    FLATKV_ASSIGN_OR_RETURN(pos, RestoreAndPrefill(prompt, keys, result, x));
  }
  uint32_t last_n = pos == 0 ? 0 : static_cast<uint32_t>(x.size() / c.dim);
  auto tp = Clock::now();
  while (pos < prompt.size()) {
    const uint32_t n = std::min<uint32_t>(options_.prefill_chunk, static_cast<uint32_t>(prompt.size()) - pos);
    PrefillChunk(prompt.subspan(pos, n), pos, x);
    result.computed_prompt_tokens += n;
    pos += n;
    last_n = n;
  }
  result.timing.prefill_ms += MsSince(tp);

  auto tf = Clock::now();
  std::vector<float> logits(c.vocab_size);
  model::Sampler sampler(c.vocab_size, options.temperature, options.top_p, options.seed);
  transformer_.Logits(x.data() + size_t{last_n - 1} * c.dim, logits.data());
  std::vector<int> context(prompt.begin(), prompt.end());  // every token whose KV is in the cache
  if (options.max_new_tokens > 0) {
    int token = sampler.Sample(logits);
    result.timing.first_decode_ms = MsSince(tf);
    result.timing.ttft_ms = MsSince(start);
    auto td = Clock::now();
    for (;;) {
      result.tokens.push_back(token);
      if (options.keep_logits) result.logits.push_back(logits);
      if (result.tokens.size() == options.max_new_tokens) break;
      if (options.stop_at_eos && model_->tokenizer && model_->tokenizer->IsEndOfGeneration(token)) break;
      const int fed[1] = {token};
      transformer_.Forward(fed, pos++, cache_, logits.data());
      context.push_back(token);
      token = sampler.Sample(logits);
    }
    result.timing.decode_ms = MsSince(td);
  } else {
    result.timing.first_decode_ms = MsSince(tf);
    result.timing.ttft_ms = MsSince(start);
  }
  auto tput = Clock::now();
  Status put = PutNewBlocks(session, context, result);
  result.timing.put_ms = MsSince(tput);
  if (!put.ok()) LogWarning("engine: storing new blocks failed (the response is unaffected): " + put.ToString());
  return result;
}

Status Engine::PutNewBlocks(SessionId session, std::span<const int> context, GenerateResult& result) {
  if (store_ == nullptr) return Status::Ok();
  const uint32_t bt = options_.block_tokens;
  const uint32_t full = static_cast<uint32_t>(context.size() / bt);
  if (full == 0) return Status::Ok();
  auto keys = hasher_.ChainKeys(ns_, AsTokens(context.first(size_t{full} * bt)), bt);
  // From the end of what this node's store holds now (Match counts local
  // blocks only): blocks another request stored meanwhile need no copy, and
  // blocks restored from the remote tier are written back, so the next
  // restore of them is local.
  const uint32_t cached_blocks = store_->Match(keys);
  if (full <= cached_blocks) return Status::Ok();
  const int layers = model_->config.n_layers;
  const uint64_t page = cache_.page_bytes();
  std::vector<std::byte> data(uint64_t{full - cached_blocks} * layers * page);
  for (uint32_t b = cached_blocks; b < full; ++b)
    for (int l = 0; l < layers; ++l)
      std::memcpy(data.data() + (uint64_t{b - cached_blocks} * layers + l) * page, cache_.PageBytes(l, b).data(), page);
  FLATKV_RETURN_IF_ERROR(store_->Put(session, std::span(keys).subspan(cached_blocks), data,
                                     {PutHint::kAuto, codec_, cached_blocks}));
  result.stored_blocks = full - cached_blocks;
  return Status::Ok();
}

Result<double> Engine::Perplexity(std::span<const int> tokens) {
  const model::Config& c = model_->config;
  if (tokens.size() < 2) return Status::InvalidArgument("perplexity: needs at least 2 tokens, got " + std::to_string(tokens.size()));
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
      return Status::InvalidArgument("perplexity: token " + std::to_string(i) + " is " + std::to_string(tokens[i]));
  double nll = 0;
  uint64_t count = 0;
  std::vector<float> x, logits(c.vocab_size);
  for (size_t start = 0; start + 1 < tokens.size(); start += options_.max_context) {
    const size_t len = std::min<size_t>(options_.max_context, tokens.size() - start);
    for (uint32_t pos = 0; pos < len; pos += options_.prefill_chunk) {
      const uint32_t n = std::min<uint32_t>(options_.prefill_chunk, static_cast<uint32_t>(len) - pos);
      PrefillChunk(tokens.subspan(start + pos, n), pos, x);
      for (uint32_t i = 0; i < n; ++i) {
        const size_t target = start + pos + i + 1;
        if (target >= start + len) break;
        transformer_.Logits(x.data() + size_t{i} * c.dim, logits.data());
        double max = logits[0];
        for (float v : logits) max = std::max<double>(max, v);
        double sum = 0;
        for (float v : logits) sum += std::exp(double(v) - max);
        nll += -(double(logits[tokens[target]]) - max - std::log(sum));
        ++count;
      }
    }
  }
  return std::exp(nll / double(count));
}

}  // namespace flatkv::engine
