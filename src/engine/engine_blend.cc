// Segmented prompts and CacheBlend's selective recompute (docs/blend.md).
//
// A prompt is prefix + chunk_1 .. chunk_k + tail, N tokens. The prefix is
// restored through chain keys (exact, as in Generate) and its remainder
// computed. Each chunk's KV is looked up under its chunk keys: stored, it is
// restored; not stored, it is prefilled on its own from position 0 and
// stored. Either way the chunk's blocks hold K before RoPE and V, and are
// placed at the chunk's positions in the prompt with K rotated there
// (Transformer::RotateKeys: the rotation a prefill applies, so exact). Then:
//   kFull   prefill every position after the prefix (the chunks' KV unused);
//   kNaive  compute only the tail, over the chunks' KV as stored;
//   kBlend  layers 0..check_layer-1 run every chunk and tail token; at
//           check_layer every chunk token's K and V are projected (and kept:
//           they are exact, as the layer's input is) and compared with the
//           reused ones, the tokens that deviate most (min(1, first_factor x
//           ratio) of them) and the tail run the layer, at check_layer + 1
//           they are filtered again to `ratio`, and later layers run only
//           those and the tail. Other tokens keep their reused KV from there on.
// At ratio 1 every token runs every layer in order: bit-identical to kFull.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

#include "common/log.h"
#include "engine/engine.h"
#include "model/chunk_kv.h"

namespace flatkv::engine {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

std::vector<uint32_t> AsTokens(std::span<const int> tokens) { return {tokens.begin(), tokens.end()}; }

// How many of n tokens a fraction keeps (ceil, so ratio 1 keeps all).
uint32_t Keep(double fraction, uint32_t n) {
  fraction = std::clamp(fraction, 0.0, 1.0);
  return std::min<uint32_t>(n, static_cast<uint32_t>(std::ceil(fraction * n - 1e-9)));
}

}  // namespace

uint32_t Engine::RestorePrefix(std::span<const int> prefix, BlendResult& result) {
  const uint32_t bt = options_.block_tokens;
  if (store_ == nullptr || prefix.size() < bt) return 0;
  auto t = Clock::now();
  const auto keys = hasher_.ChainKeys(ns_, AsTokens(prefix), bt);
  RestoreTarget target;
  target.destination = [this](uint32_t l, uint32_t b) { return cache_.PageBytes(static_cast<int>(l), b).data(); };
  auto started = store_->StartRestore(keys, target);
  result.timing.hash_lookup_ms += MsSince(t);
  if (!started.ok()) return 0;
  Restore& restore = *started.value();
  const uint32_t hit = restore.hit_blocks();
  if (hit == 0) return 0;
  t = Clock::now();
  bool complete = true;
  for (int l = 0; l < model_->config.n_layers; ++l) {
    auto view = restore.WaitLayer(static_cast<uint32_t>(l));
    complete = complete && view.ok() && view->blocks == hit;
    restore.ReleaseLayer(static_cast<uint32_t>(l));
  }
  complete = restore.Finish() == hit && complete;
  result.timing.restore_ms += MsSince(t);
  if (!complete) {
    LogWarning("engine: blend: the prefix lost blocks while loading; recomputing it");
    return 0;
  }
  return hit * bt;
}

Status Engine::LoadChunk(std::span<const int> chunk, uint32_t pos0, bool store_chunk, BlendResult& result) {
  const model::Config& c = model_->config;
  const uint32_t bt = options_.block_tokens, n = static_cast<uint32_t>(chunk.size());
  const int layers = c.n_layers, kv_dim = c.kv_dim();
  const uint64_t page = cache_.page_bytes();
  // The chunk's KV as chunk rows (model/chunk_kv.h: per layer n K rows, K
  // before RoPE, then n V rows), whether restored or computed here.
  const model::ChunkLayout layout(ShapeFor(c), bt, page);
  std::vector<float> rows(layout.rows_bytes(n) / sizeof(float));
  auto* row_bytes = reinterpret_cast<std::byte*>(rows.data());
  auto t = Clock::now();
  const auto keys = hasher_.ChunkKeys(ns_, AsTokens(chunk), bt);
  const uint32_t blocks = static_cast<uint32_t>(keys.size());
  bool restored = false;
  if (store_ != nullptr && store_->Match(keys) == blocks) {
    auto started = store_->StartRestore(keys);
    result.timing.hash_lookup_ms += MsSince(t);
    if (started.ok() && started.value()->hit_blocks() == blocks) {
      Restore& restore = *started.value();
      auto tw = Clock::now();
      restored = true;
      for (int l = 0; l < layers; ++l) {
        auto view = restore.WaitLayer(static_cast<uint32_t>(l));
        if (!view.ok() || view->blocks != blocks) {
          restored = false;
          restore.ReleaseLayer(static_cast<uint32_t>(l));
          break;
        }
        // Straight from the window into chunk rows (the view: one slice per block).
        layout.LayerToRows(static_cast<uint32_t>(l), view->data.data(), page, n, n, row_bytes);
        restore.ReleaseLayer(static_cast<uint32_t>(l));
      }
      restored = restore.Finish() == blocks && restored;
      result.timing.restore_ms += MsSince(tw);
      if (!restored) LogWarning("engine: blend: a chunk lost blocks while loading; recomputing it");
    }
  } else {
    result.timing.hash_lookup_ms += MsSince(t);
  }
  if (restored) {
    result.reused_chunk_tokens += n;
  } else {
    // Prefill the chunk alone at positions 0..n-1, keeping K before RoPE.
    auto tc = Clock::now();
    model::KvCache scratch(c, bt, blocks * bt);
    const uint64_t layer_floats = uint64_t{n} * 2 * kv_dim;
    transformer_.set_key_sink([&](int l, uint32_t p, const float* k) {
      std::memcpy(rows.data() + l * layer_floats + uint64_t{p} * kv_dim, k, kv_dim * sizeof(float));
    });
    std::vector<float> x(size_t{n} * c.dim);
    transformer_.Embed(chunk, x.data());
    for (int l = 0; l < layers; ++l) transformer_.Layer(l, 0, n, x.data(), scratch);
    transformer_.set_key_sink(nullptr);
    for (int l = 0; l < layers; ++l)
      for (uint32_t p = 0; p < n; ++p)
        std::memcpy(rows.data() + l * layer_floats + uint64_t{n + p} * kv_dim, scratch.v(l, p), kv_dim * sizeof(float));
    result.prefilled_chunk_tokens += n;
    result.computed_token_layers += uint64_t{n} * layers;
    result.timing.prefill_ms += MsSince(tc);
    if (store_ != nullptr && store_chunk) {
      std::vector<std::byte> data(uint64_t{blocks} * layout.block_bytes());  // a partial block's tail stays zero
      layout.RowsToBlocks(row_bytes, n, data.data());
      Status put = store_->Put(ChunkSession(keys[0]), keys, data, {PutHint::kAuto, codec_, 0});
      if (!put.ok()) LogWarning("engine: blend: storing a chunk failed (the response is unaffected): " + put.ToString());
    }
  }
  // Place the chunk at pos0.., rotating its keys to their new positions with
  // the rotation Layer applies (exact: a prefill's bytes for these keys).
  auto tc = Clock::now();
  auto rope = model::PlanChunkRope({c.rope_theta, 0, model::RopeStyle::kInterleaved}, layout.shape, pos0, n);
  if (!rope.ok()) return rope.status();
  model::RotateChunkKeys(row_bytes, layout, n, n, pos0, *rope);
  const uint64_t layer_floats = uint64_t{n} * 2 * kv_dim;
  for (int l = 0; l < layers; ++l)
    for (uint32_t p = 0; p < n; ++p) {
      std::memcpy(cache_.k(l, pos0 + p), rows.data() + l * layer_floats + uint64_t{p} * kv_dim, kv_dim * sizeof(float));
      std::memcpy(cache_.v(l, pos0 + p), rows.data() + l * layer_floats + uint64_t{n + p} * kv_dim, kv_dim * sizeof(float));
    }
  result.timing.restore_ms += MsSince(tc);
  return Status::Ok();
}

Result<BlendResult> Engine::Blend(SessionId session, const BlendPrompt& prompt, const BlendOptions& options) {
  const auto start = Clock::now();
  const model::Config& c = model_->config;
  const int layers = c.n_layers, dim = c.dim, kv_dim = c.kv_dim();
  if (prompt.tail.empty()) return Status::InvalidArgument("blend: the tail is empty");
  if (options.score_tokens == 0 || options.score_tokens > prompt.tail.size())
    return Status::InvalidArgument("blend: score_tokens=" + std::to_string(options.score_tokens) + " (expected 1.." +
                                   std::to_string(prompt.tail.size()) + ", the tail's length)");
  if (!(options.recompute_ratio >= 0.0f && options.recompute_ratio <= 1.0f))
    return Status::InvalidArgument("blend: recompute_ratio=" + std::to_string(options.recompute_ratio) + " (expected 0..1)");
  std::vector<int> tokens(prompt.prefix.begin(), prompt.prefix.end());
  const uint32_t prefix_len = static_cast<uint32_t>(tokens.size());
  std::vector<uint32_t> chunk_pos;  // where each chunk starts
  for (const auto& chunk : prompt.chunks) {
    if (chunk.empty()) return Status::InvalidArgument("blend: chunk " + std::to_string(chunk_pos.size()) + " is empty");
    chunk_pos.push_back(static_cast<uint32_t>(tokens.size()));
    tokens.insert(tokens.end(), chunk.begin(), chunk.end());
  }
  const uint32_t tail_pos = static_cast<uint32_t>(tokens.size());
  tokens.insert(tokens.end(), prompt.tail.begin(), prompt.tail.end());
  const uint32_t total = static_cast<uint32_t>(tokens.size());
  FLATKV_RETURN_IF_ERROR(CheckTokens(tokens, "blend"));
  if (total > options_.max_context)
    return Status::InvalidArgument("blend: a prompt of " + std::to_string(total) + " tokens exceeds max_context " +
                                   std::to_string(options_.max_context));
  BlendResult result;
  result.prompt_tokens = total;
  const std::span<const int> all(tokens);

  // The prefix: restored blocks, then its remainder computed (exact).
  uint32_t pos = RestorePrefix(all.first(prefix_len), result);
  result.restored_prefix_tokens = pos;
  std::vector<float> x;
  auto tp = Clock::now();
  for (; pos < prefix_len;) {
    const uint32_t n = std::min(options_.prefill_chunk, prefix_len - pos);
    PrefillChunk(all.subspan(pos, n), pos, x);
    result.computed_token_layers += uint64_t{n} * layers;
    pos += n;
  }
  result.timing.prefill_ms += MsSince(tp);

  const uint32_t score_from = total - options.score_tokens;
  auto keep_logits = [&](const float* rows, uint32_t first_pos, uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) {
      if (first_pos + i < score_from) continue;
      result.logits.emplace_back(c.vocab_size);
      transformer_.Logits(rows + size_t{i} * dim, result.logits.back().data());
    }
  };

  if (options.mode == BlendMode::kFull) {
    tp = Clock::now();
    while (pos < total) {
      const uint32_t n = std::min(options_.prefill_chunk, total - pos);
      PrefillChunk(all.subspan(pos, n), pos, x);
      result.computed_token_layers += uint64_t{n} * layers;
      keep_logits(x.data(), pos, n);
      pos += n;
    }
    result.timing.prefill_ms += MsSince(tp);
  } else {
    for (size_t i = 0; i < prompt.chunks.size(); ++i)
      FLATKV_RETURN_IF_ERROR(LoadChunk(prompt.chunks[i], chunk_pos[i], options.store_chunks, result));
    tp = Clock::now();
    const uint32_t chunk_tokens = tail_pos - prefix_len;
    // The active tokens (ascending positions) and their residual rows.
    std::vector<uint32_t> active;
    const uint32_t first = options.mode == BlendMode::kNaive ? tail_pos : prefix_len;
    for (uint32_t p = first; p < total; ++p) active.push_back(p);
    x.resize(active.size() * static_cast<size_t>(dim));
    transformer_.Embed(all.subspan(first), x.data());
    const uint32_t check = std::min<uint32_t>(options.check_layer, static_cast<uint32_t>(layers) - 1);
    const uint32_t keep_first = Keep(double(options.first_factor) * options.recompute_ratio, chunk_tokens);
    const uint32_t keep_final = std::min(keep_first, Keep(options.recompute_ratio, chunk_tokens));
    std::vector<float> old_k, old_v;
    for (int l = 0; l < layers; ++l) {
      // Chunk tokens still active are candidates; the tail always runs.
      const size_t candidates = std::lower_bound(active.begin(), active.end(), tail_pos) - active.begin();
      uint32_t keep = static_cast<uint32_t>(candidates);
      if (options.mode == BlendMode::kBlend) {
        if (uint32_t(l) == check) keep = keep_first;
        if (uint32_t(l) == check + 1) keep = std::min<uint32_t>(keep, keep_final);
      }
      const bool select = keep < candidates;
      if (select) {  // the reused KV, to compare with
        old_k.resize(candidates * kv_dim);
        old_v.resize(candidates * kv_dim);
        for (size_t i = 0; i < candidates; ++i) {
          std::memcpy(old_k.data() + i * kv_dim, cache_.k(l, active[i]), kv_dim * sizeof(float));
          std::memcpy(old_v.data() + i * kv_dim, cache_.v(l, active[i]), kv_dim * sizeof(float));
        }
      }
      // At the check layer every candidate's new K and V are computed (cheap:
      // two projections) and kept, but the layer runs only for the selected
      // tokens and the tail; at later selections the candidates ran it.
      const bool kv_first = select && uint32_t(l) == check;
      if (kv_first) {
        transformer_.KeysValuesAt(l, std::span<const uint32_t>(active).first(candidates), x.data(), cache_);
        result.kv_only_token_layers += candidates;
      } else {
        transformer_.LayerAt(l, active, x.data(), cache_);
        result.computed_token_layers += active.size();
      }
      if (!select) continue;
      // KV deviation: squared L2 distance of the new K and V rows from the reused ones.
      std::vector<std::pair<double, uint32_t>> dev(candidates);
      for (size_t i = 0; i < candidates; ++i) {
        double d = 0;
        const float* k = cache_.k(l, active[i]);
        const float* v = cache_.v(l, active[i]);
        for (int j = 0; j < kv_dim; ++j) {
          const double dk = double(k[j]) - old_k[i * kv_dim + j], dv = double(v[j]) - old_v[i * kv_dim + j];
          d += dk * dk + dv * dv;
        }
        dev[i] = {d, static_cast<uint32_t>(i)};
      }
      std::partial_sort(dev.begin(), dev.begin() + keep, dev.end(),
                        [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
      std::vector<uint32_t> rows;
      for (uint32_t i = 0; i < keep; ++i) rows.push_back(dev[i].second);
      std::sort(rows.begin(), rows.end());
      for (size_t i = candidates; i < active.size(); ++i) rows.push_back(static_cast<uint32_t>(i));
      std::vector<uint32_t> next(rows.size());
      std::vector<float> nx(rows.size() * static_cast<size_t>(dim));
      for (size_t i = 0; i < rows.size(); ++i) {
        next[i] = active[rows[i]];
        std::memcpy(nx.data() + i * dim, x.data() + size_t{rows[i]} * dim, dim * sizeof(float));
      }
      active = std::move(next);
      x = std::move(nx);
      if (kv_first) {  // the layer itself, for the survivors (rewriting the same K and V)
        transformer_.LayerAt(l, active, x.data(), cache_);
        result.computed_token_layers += active.size();
      }
    }
    for (uint32_t p : active)
      if (p < tail_pos) result.selected.push_back(p);
    const size_t tail_rows = total - tail_pos;
    keep_logits(x.data() + (active.size() - tail_rows) * dim, tail_pos, static_cast<uint32_t>(tail_rows));
    result.timing.prefill_ms += MsSince(tp);
  }
  result.computed_fraction = double(result.computed_token_layers) / (double(total) * layers);
  result.timing.ttft_ms = MsSince(start);

  if (store_ != nullptr) {
    auto tput = Clock::now();
    GenerateResult put_result;
    Status put = PutNewBlocks(session, all.first(prefix_len), put_result);
    if (!put.ok()) LogWarning("engine: blend: storing the prefix failed (the response is unaffected): " + put.ToString());
    result.timing.put_ms = MsSince(tput);
  }
  return result;
}

}  // namespace flatkv::engine
