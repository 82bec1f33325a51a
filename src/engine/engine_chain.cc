// Cross-request state of compacted sessions (docs/attention.md, "Chain
// Cache" and "Pruned views"): Chain Cache resumes a KV-eviction method from
// the previous request's compacted KV and re-runs it over the kept entries
// plus the new turn only; prefix-cache pruning stores and restores a view of
// a stored history without some of its tokens (flatkv/prune.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "engine/engine.h"
#include "engine/engine_hooks.h"

namespace flatkv::engine {
namespace {

double MsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// The allocator budget that keeps `keep` of `n` candidates per head.
attention::CompactOptions Keeping(const attention::CompactOptions& o, uint32_t keep, uint32_t n) {
  attention::CompactOptions k = o;
  k.allocator = attention::Allocator::kUniform;  // equal counts per head: what the next turn extends
  k.budget.ratio = keep >= n ? 0.0 : 1.0 - static_cast<double>(keep) / n;
  return k;
}

// Query-key evaluations of `w` window queries, the last at candidate count
// `n`, causal (query j sees n - w + j + 1 candidates), per query head.
uint64_t WindowEvals(uint32_t n, uint32_t w) { return uint64_t{w} * n - uint64_t{w} * (w - 1) / 2; }

}  // namespace

double ContinuationNll::Perplexity() const { return count == 0 ? 0.0 : std::exp(nll_sum / count); }

void Engine::PrefillRecording(std::span<const int> tokens, uint32_t pos0, std::vector<float>& x,
                              std::vector<float>* queries) {
  const model::Config& c = model_->config;
  const size_t hs = c.head_size(), heads = c.n_heads, n = tokens.size();
  if (queries != nullptr) queries->assign(static_cast<size_t>(c.n_layers) * heads * n * hs, 0.0f);
  QuerySinkGuard sink(transformer_, [&](int layer, uint32_t pos, const float* q) {
    if (queries == nullptr || pos < pos0 || pos >= pos0 + n) return;
    for (size_t h = 0; h < heads; ++h)
      std::copy_n(q + h * hs, hs, queries->data() + ((static_cast<size_t>(layer) * heads + h) * n + (pos - pos0)) * hs);
  });
  for (uint32_t i = 0; i < n; i += options_.prefill_chunk) {
    const uint32_t m = std::min<uint32_t>(options_.prefill_chunk, static_cast<uint32_t>(n - i));
    PrefillChunk(tokens.subspan(i, m), pos0 + i, x);
  }
}

std::vector<BlockKey> Engine::PrefixKeys(std::span<const int> tokens, uint32_t blocks) const {
  const std::vector<uint32_t> t(tokens.begin(), tokens.begin() + size_t{blocks} * options_.block_tokens);
  return hasher_.ChainKeys(ns_, t, options_.block_tokens);
}

Result<attention::CompactedKv> Engine::ExtendCompacted(const attention::CompactedKv& prev, std::span<const int> turn,
                                                       const attention::CompactOptions& o, uint32_t keep_per_head,
                                                       CompactionWork* work) {
  const model::Config& c = model_->config;
  if (o.scorer == nullptr) return Status::InvalidArgument("chain cache: no scorer");
  if (prev.n_layers != c.n_layers || prev.n_kv_heads != c.n_kv_heads || prev.head_dim != c.head_size() ||
      prev.heads.size() != static_cast<size_t>(c.n_layers) * c.n_kv_heads)
    return Status::InvalidArgument("chain cache: the compacted KV's shape does not match the model");
  FLATKV_RETURN_IF_ERROR(CheckTokens(turn, "chain cache"));
  const uint32_t base = prev.prefix_len, T = static_cast<uint32_t>(turn.size());
  if (uint64_t{base} + T > options_.max_context)
    return Status::InvalidArgument("chain cache: prefix " + std::to_string(base) + " + turn of " + std::to_string(T) +
                                   " tokens exceeds max_context " + std::to_string(options_.max_context));
  const int hs = c.head_size(), H = c.n_heads, KVH = c.n_kv_heads;
  for (int l = 0; l < c.n_layers; ++l)
    for (int h = 1; h < KVH; ++h)
      if (prev.at(l, h).pos.size() != prev.at(l, 0).pos.size())
        return Status::InvalidArgument("chain cache: layer " + std::to_string(l) + " heads keep " +
                                       std::to_string(prev.at(l, 0).pos.size()) + " and " +
                                       std::to_string(prev.at(l, h).pos.size()) +
                                       " entries; it extends equal counts per head (a uniform allocation)");
  // The turn, attending to prev's kept entries, its queries recorded.
  std::vector<float> queries, x;
  CompactionWork cost;
  auto t0 = std::chrono::steady_clock::now();
  {
    HookGuard hook(transformer_, attention::CompactedAttention(prev, c));
    PrefillRecording(turn, base, x, &queries);
  }
  cost.prefill_ms = MsSince(t0);
  t0 = std::chrono::steady_clock::now();
  const uint32_t w = o.scorer->uses_all_queries() ? T : std::min(o.window, T);
  std::vector<uint32_t> qpos(w);
  for (uint32_t j = 0; j < w; ++j) qpos[j] = base + T - w + j;
  std::vector<attention::HeadScores> scores;
  std::vector<float> k, v, q(static_cast<size_t>(H) * w * hs);
  std::vector<uint32_t> key_pos;
  uint32_t n = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    // Candidates per KV head: prev's kept entries (key positions 0..m-1
    // stand for them: every one precedes the turn, which is all causality
    // needs), then the turn's tokens at their positions.
    const auto m = static_cast<uint32_t>(prev.at(l, 0).pos.size());
    n = m + T;
    k.resize(static_cast<size_t>(KVH) * n * hs);
    v.resize(k.size());
    for (int h = 0; h < KVH; ++h) {
      const attention::CompactedKv::Head& kept = prev.at(l, h);
      float* kh = k.data() + static_cast<size_t>(h) * n * hs;
      float* vh = v.data() + static_cast<size_t>(h) * n * hs;
      std::copy(kept.k.begin(), kept.k.end(), kh);
      std::copy(kept.v.begin(), kept.v.end(), vh);
      for (uint32_t t = 0; t < T; ++t) {
        std::copy_n(cache_.k(l, base + t) + h * hs, hs, kh + size_t{m + t} * hs);
        std::copy_n(cache_.v(l, base + t) + h * hs, hs, vh + size_t{m + t} * hs);
      }
    }
    key_pos.resize(n);
    for (uint32_t t = 0; t < n; ++t) key_pos[t] = t < m ? t : base + (t - m);
    const float* ql = queries.data() + static_cast<size_t>(H) * T * hs * l;  // [h][t][d]
    for (int h = 0; h < H; ++h)
      std::copy_n(ql + (static_cast<size_t>(h) * T + (T - w)) * hs, size_t{w} * hs, q.data() + static_cast<size_t>(h) * w * hs);
    attention::LayerKv kv{H, KVH, hs, n, k, v, key_pos, attention::QueryBlock{q, qpos}};
    attention::ScoreContext ctx;
    ctx.layer = l;
    ctx.n_layers = c.n_layers;
    if (static_cast<size_t>(l) < o.phases.size()) ctx.phases = o.phases[l];
    if (static_cast<size_t>(l) < o.probes.size()) ctx.probes = o.probes[l];
    FLATKV_ASSIGN_OR_RETURN(attention::HeadScores s, o.scorer->Score(kv, ctx));
    scores.push_back(std::move(s));
    cost.score_evals += uint64_t(H) * WindowEvals(n, w);
    // The turn's prefill: token t saw the m kept entries and turn tokens 0..t.
    cost.prefill_evals += uint64_t(H) * (uint64_t{T} * m + uint64_t{T} * (T + 1) / 2);
  }
  cost.candidates = n;
  const attention::CompactOptions ko = Keeping(o, keep_per_head, n);
  FLATKV_ASSIGN_OR_RETURN(attention::Selection sel, attention::Allocate(ko.allocator, scores, ko.budget));
  attention::CompactedKv out;
  out.n_layers = c.n_layers;
  out.n_kv_heads = KVH;
  out.head_dim = hs;
  out.prefix_len = base + T;
  out.heads.resize(prev.heads.size());
  for (int l = 0; l < c.n_layers; ++l)
    for (int h = 0; h < KVH; ++h) {
      const attention::CompactedKv::Head& kept = prev.at(l, h);
      attention::CompactedKv::Head& dst = out.at(l, h);
      const auto m = static_cast<uint32_t>(kept.pos.size());
      for (uint32_t idx : sel[l][h]) {
        if (idx < m) {
          dst.pos.push_back(kept.pos[idx]);
          dst.k.insert(dst.k.end(), kept.k.begin() + size_t{idx} * hs, kept.k.begin() + size_t{idx + 1} * hs);
          dst.v.insert(dst.v.end(), kept.v.begin() + size_t{idx} * hs, kept.v.begin() + size_t{idx + 1} * hs);
        } else {
          const uint32_t p = base + (idx - m);
          dst.pos.push_back(p);
          dst.k.insert(dst.k.end(), cache_.k(l, p) + h * hs, cache_.k(l, p) + (h + 1) * hs);
          dst.v.insert(dst.v.end(), cache_.v(l, p) + h * hs, cache_.v(l, p) + (h + 1) * hs);
        }
      }
    }
  cost.score_ms = MsSince(t0);
  if (work != nullptr) *work = cost;
  return out;
}

Result<attention::CompactedKv> Engine::CompactKeeping(std::span<const int> prompt, const attention::CompactOptions& o,
                                                      uint32_t keep_per_head, CompactionWork* work, uint32_t cached) {
  if (o.scorer == nullptr) return Status::InvalidArgument("compact: no scorer");
  FLATKV_RETURN_IF_ERROR(CheckTokens(prompt, "compact"));
  const model::Config& c = model_->config;
  const auto n = static_cast<uint32_t>(prompt.size());
  if (n > options_.max_context)
    return Status::InvalidArgument("compact: prompt of " + std::to_string(n) + " tokens exceeds max_context " +
                                   std::to_string(options_.max_context));
  const uint32_t w = o.scorer->uses_all_queries() ? n : std::min(o.window, n);
  if (cached >= n || (cached > 0 && n - cached < w))
    return Status::InvalidArgument("compact: " + std::to_string(cached) + " cached of " + std::to_string(n) +
                                   " tokens leaves fewer new tokens than the scorer's " + std::to_string(w) + " queries");
  // The new tokens, densely, their queries recorded; the scorer reads only
  // the last w of them, so the cached positions' queries are never needed.
  std::vector<float> fresh, x;
  auto t0 = std::chrono::steady_clock::now();
  PrefillRecording(prompt.subspan(cached), cached, x, &fresh);
  const double prefill_ms = MsSince(t0);
  t0 = std::chrono::steady_clock::now();
  const size_t hs = c.head_size(), heads = c.n_heads, m = n - cached;
  std::vector<float> queries(static_cast<size_t>(c.n_layers) * heads * n * hs, 0.0f);  // [layer][h][t][d]
  for (int l = 0; l < c.n_layers; ++l)
    for (size_t h = 0; h < heads; ++h)
      std::copy_n(fresh.data() + ((static_cast<size_t>(l) * heads + h) * m) * hs, m * hs,
                  queries.data() + ((static_cast<size_t>(l) * heads + h) * n + cached) * hs);
  FLATKV_ASSIGN_OR_RETURN(attention::CompactedKv out,
                          attention::ScoreAndCompact(cache_, c, n, queries, Keeping(o, keep_per_head, n)));
  if (work != nullptr) {
    work->score_evals = uint64_t(c.n_layers) * c.n_heads * WindowEvals(n, w);
    // The prefill it ran: token t saw positions 0..t.
    work->prefill_evals = uint64_t(c.n_layers) * c.n_heads * (uint64_t{n} * (n + 1) / 2 - uint64_t{cached} * (cached + 1) / 2);
    work->candidates = n;
    work->prefill_ms = prefill_ms;
    work->score_ms = MsSince(t0);
  }
  return out;
}

Result<attention::CompactedKv> Engine::CachedAsCompacted(uint32_t n) const {
  const model::Config& c = model_->config;
  if (n == 0 || n > options_.max_context)
    return Status::InvalidArgument("cached-as-compacted: " + std::to_string(n) + " positions (max_context " +
                                   std::to_string(options_.max_context) + ")");
  std::vector<uint32_t> all(n);
  for (uint32_t i = 0; i < n; ++i) all[i] = i;
  const attention::Selection sel(c.n_layers, std::vector<std::vector<uint32_t>>(c.n_kv_heads, all));
  return attention::Compact(cache_, c, n, sel);
}

Result<attention::CompactedKv> Engine::Uncompacted(std::span<const int> prompt) {
  FLATKV_RETURN_IF_ERROR(CheckTokens(prompt, "uncompacted"));
  const auto n = static_cast<uint32_t>(prompt.size());
  if (n > options_.max_context)
    return Status::InvalidArgument("uncompacted: " + std::to_string(n) + " tokens exceed max_context " +
                                   std::to_string(options_.max_context));
  std::vector<float> x;
  PrefillRecording(prompt, 0, x, nullptr);
  return CachedAsCompacted(n);
}

Result<ContinuationNll> Engine::ScoreCompacted(const attention::CompactedKv& ckv, std::span<const int> next,
                                               uint32_t score_from) {
  const model::Config& c = model_->config;
  if (score_from == 0 || score_from >= next.size())
    return Status::InvalidArgument("score: score_from " + std::to_string(score_from) + " of " + std::to_string(next.size()) +
                                   " tokens (1..n-1)");
  FLATKV_RETURN_IF_ERROR(CheckTokens(next, "score"));
  if (ckv.n_layers != c.n_layers || ckv.n_kv_heads != c.n_kv_heads || ckv.head_dim != c.head_size())
    return Status::InvalidArgument("score: the compacted KV's shape does not match the model");
  if (uint64_t{ckv.prefix_len} + next.size() > options_.max_context)
    return Status::InvalidArgument("score: prefix " + std::to_string(ckv.prefix_len) + " + " + std::to_string(next.size()) +
                                   " tokens exceed max_context " + std::to_string(options_.max_context));
  HookGuard hook(transformer_, attention::CompactedAttention(ckv, c));
  ContinuationNll out;
  std::vector<float> x, logits;
  const auto n = static_cast<uint32_t>(next.size());
  for (uint32_t i = 0; i < n; i += options_.prefill_chunk) {
    const uint32_t m = std::min(options_.prefill_chunk, n - i);
    PrefillChunk(next.subspan(i, m), ckv.prefix_len + i, x);
    logits.resize(size_t{m} * c.vocab_size);
    transformer_.Logits(x.data(), logits.data(), static_cast<int>(m));
    for (uint32_t r = 0; r < m && i + r + 1 < n; ++r) {
      if (i + r + 1 < score_from) continue;
      const float* row = logits.data() + size_t{r} * c.vocab_size;
      const float mx = *std::max_element(row, row + c.vocab_size);
      double sum = 0;
      for (int t = 0; t < c.vocab_size; ++t) sum += std::exp(static_cast<double>(row[t]) - mx);
      out.nll_sum += std::log(sum) + mx - row[next[i + r + 1]];
      ++out.count;
    }
  }
  return out;
}

Result<PruneResult> Engine::PruneHistory(std::span<const int> history, const PruneSpec& prune) {
  if (store_ == nullptr) return Status::FailedPrecondition("prune: the engine has no store");
  FLATKV_RETURN_IF_ERROR(CheckTokens(history, "prune"));
  const uint32_t bt = options_.block_tokens;
  if (prune.logical_blocks == 0 || uint64_t{prune.logical_blocks} * bt > history.size())
    return Status::InvalidArgument("prune: " + std::to_string(prune.logical_blocks) + " logical blocks of " +
                                   std::to_string(bt) + " tokens; the history has " + std::to_string(history.size()) +
                                   " tokens");
  PutOptions po;
  po.codec = codec_;
  return store_->Prune(PrefixKeys(history, prune.logical_blocks), prune.ranges, po);
}

Result<attention::CompactedKv> Engine::RestorePruned(std::span<const int> prompt, const PruneSpec& prune) {
  if (store_ == nullptr) return Status::FailedPrecondition("restore-pruned: the engine has no store");
  FLATKV_RETURN_IF_ERROR(CheckTokens(prompt, "restore-pruned"));
  const model::Config& c = model_->config;
  const uint32_t bt = options_.block_tokens, N = prune.logical_blocks;
  if (N == 0 || uint64_t{N} * bt > prompt.size())
    return Status::InvalidArgument("restore-pruned: " + std::to_string(N) + " logical blocks of " + std::to_string(bt) +
                                   " tokens; the prompt has " + std::to_string(prompt.size()) + " tokens");
  FLATKV_RETURN_IF_ERROR(ValidatePruneSet(prune.ranges, N * bt).WithContext("restore-pruned"));
  const std::vector<BlockKey> logical = PrefixKeys(prompt, N);
  const std::vector<BlockKey> keys = PruneViewKeys(logical.back(), N, prune.ranges, bt);
  const std::vector<uint32_t> kept = PruneKeptPositions(prune.ranges, N * bt);
  FLATKV_ASSIGN_OR_RETURN(auto restore, store_->StartRestore(keys));
  const auto view_blocks = static_cast<uint32_t>(keys.size());
  if (restore->hit_blocks() < view_blocks)
    return Status::NotFound("restore-pruned: " + std::to_string(restore->hit_blocks()) + " of the view's " +
                            std::to_string(view_blocks) + " blocks are stored");
  const int hs = c.head_size(), KVH = c.n_kv_heads, kv_dim = c.kv_dim();
  attention::CompactedKv out;
  out.n_layers = c.n_layers;
  out.n_kv_heads = KVH;
  out.head_dim = hs;
  out.prefix_len = N * bt;
  out.heads.resize(static_cast<size_t>(c.n_layers) * KVH);
  const uint64_t slice = store_->BlockLayerBytes();
  for (int l = 0; l < c.n_layers; ++l) {
    FLATKV_ASSIGN_OR_RETURN(LayerView view, restore->WaitLayer(static_cast<uint32_t>(l)));
    if (view.blocks != view_blocks) {
      restore->ReleaseLayer(static_cast<uint32_t>(l));
      return Status::NotFound("restore-pruned: layer " + std::to_string(l) + " restored " + std::to_string(view.blocks) +
                              " of " + std::to_string(view_blocks) + " blocks");
    }
    for (int h = 0; h < KVH; ++h) {
      attention::CompactedKv::Head& head = out.at(l, h);
      head.pos = kept;
      head.k.resize(kept.size() * hs);
      head.v.resize(kept.size() * hs);
      for (size_t j = 0; j < kept.size(); ++j) {
        // A page: K rows of bt tokens (kv_dim floats each), then V rows.
        const auto* page = reinterpret_cast<const float*>(view.data.data() + (j / bt) * slice);
        const size_t row = j % bt;
        std::memcpy(head.k.data() + j * hs, page + row * kv_dim + h * hs, hs * sizeof(float));
        std::memcpy(head.v.data() + j * hs, page + (bt + row) * kv_dim + h * hs, hs * sizeof(float));
      }
    }
    restore->ReleaseLayer(static_cast<uint32_t>(l));
  }
  if (restore->Finish() < view_blocks) return Status::NotFound("restore-pruned: view blocks lost while loading");
  return out;
}

Result<GenerateResult> Engine::GeneratePruned(SessionId session, std::span<const int> prompt, const PruneSpec& prune,
                                              const GenerateOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const uint32_t bt = options_.block_tokens;
  if (prune.ranges.empty()) return Generate(session, prompt, options);
  if (uint64_t{prune.logical_blocks} * bt >= prompt.size())
    return Status::InvalidArgument("generate-pruned: the prompt of " + std::to_string(prompt.size()) +
                                   " tokens must go on past the view's " + std::to_string(prune.logical_blocks * bt));
  auto ckv = RestorePruned(prompt, prune);
  if (!ckv.ok()) {
    if (ckv.status().code() != Code::kNotFound) return ckv.status();
    return Generate(session, prompt, options);  // no view: the exact, dense request
  }
  const double restore_ms = MsSince(start);
  FLATKV_ASSIGN_OR_RETURN(GenerateResult r, GenerateCompacted(*ckv, prompt.subspan(size_t{prune.logical_blocks} * bt), options));
  r.prompt_tokens = static_cast<uint32_t>(prompt.size());
  r.restored_pruned_tokens = static_cast<uint32_t>(ckv->at(0, 0).pos.size());
  r.timing.restore_ms = restore_ms;
  r.timing.ttft_ms = MsSince(start);  // with max_new_tokens = 1: to the first token
  return r;
}

}  // namespace flatkv::engine
