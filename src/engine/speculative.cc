// Self-speculative decoding with RIFT refresh (engine/speculative.h).
#include "engine/speculative.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

#include "attention/scoring.h"
#include "model/fp_math.h"

namespace flatkv::engine {
namespace {

constexpr uint32_t kRing = 128;  // recorded query positions per layer (obs_window + gamma + 1 at most)

double Ms(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

int Argmax(const float* logits, int n) { return static_cast<int>(std::max_element(logits, logits + n) - logits); }

}  // namespace

std::string RefreshModeName(RefreshMode m) {
  switch (m) {
    case RefreshMode::kPrefillOnly: return "prefill";
    case RefreshMode::kEveryN: return "every";
    case RefreshMode::kAdaptive: return "adaptive";
  }
  return "?";
}

Result<RefreshMode> ParseRefreshMode(const std::string& name) {
  for (RefreshMode m : {RefreshMode::kPrefillOnly, RefreshMode::kEveryN, RefreshMode::kAdaptive})
    if (RefreshModeName(m) == name) return m;
  return Status::InvalidArgument("refresh mode must be prefill, every or adaptive, got '" + name + "'");
}

SelfSpeculativeDecoder::SelfSpeculativeDecoder(const model::Model& m, uint32_t max_positions, int threads)
    : model_(m),
      target_(m, model::TransformerOptions{threads, {}}),
      drafter_(m, model::TransformerOptions{threads, {}}),
      cache_(m.config, 64, max_positions) {
  const model::Config& c = m.config;
  ring_ = kRing;
  queries_.assign(size_t(c.n_layers) * ring_ * c.dim, 0.0f);
  query_pos_.assign(size_t(c.n_layers) * ring_, UINT32_MAX);
  selected_.resize(size_t(c.n_layers) * c.n_kv_heads);
  target_.set_query_sink([this](int layer, uint32_t pos, const float* q) { RecordQuery(layer, pos, q); });
  drafter_.set_attention_hook([this](int layer, uint32_t pos0, uint32_t n, const float* q, const model::KvCache& cache,
                                     float* o) { DraftAttention(layer, pos0, n, q, cache, o); });
}

SelfSpeculativeDecoder::~SelfSpeculativeDecoder() = default;

void SelfSpeculativeDecoder::RecordQuery(int layer, uint32_t pos, const float* q) {
  const int dim = model_.config.dim;
  const size_t slot = size_t(layer) * ring_ + pos % ring_;
  std::memcpy(queries_.data() + slot * dim, q, dim * sizeof(float));
  query_pos_[slot] = pos;
}

Status SelfSpeculativeDecoder::Prefill(std::span<const int> prompt) {
  const model::Config& c = model_.config;
  if (prompt.empty()) return Status::InvalidArgument("speculative: empty prompt");
  if (prompt.size() >= cache_.max_positions())
    return Status::InvalidArgument("speculative: prompt of " + std::to_string(prompt.size()) + " tokens does not fit " +
                                   std::to_string(cache_.max_positions()) + " positions");
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= c.vocab_size)
      return Status::InvalidArgument("speculative: prompt token " + std::to_string(i) + " is " + std::to_string(prompt[i]));
  const auto t0 = std::chrono::steady_clock::now();
  prompt_.assign(prompt.begin(), prompt.end());
  prompt_logits_.assign(c.vocab_size, 0.0f);
  constexpr uint32_t kChunk = 256;
  for (uint32_t pos = 0; pos < prompt.size(); pos += kChunk) {
    const uint32_t n = std::min<uint32_t>(kChunk, static_cast<uint32_t>(prompt.size()) - pos);
    target_.Forward(prompt.subspan(pos, n), pos, cache_, prompt_logits_.data());
  }
  prefill_ms_ = Ms(t0, std::chrono::steady_clock::now());
  return Status::Ok();
}

Result<TargetResult> SelfSpeculativeDecoder::Target(uint32_t max_new_tokens, bool stop_at_eos) {
  const model::Config& c = model_.config;
  if (prompt_.empty()) return Status::FailedPrecondition("speculative: Target before Prefill");
  const uint32_t P = static_cast<uint32_t>(prompt_.size());
  if (max_new_tokens == 0 || P + max_new_tokens > cache_.max_positions())
    return Status::InvalidArgument("speculative: " + std::to_string(max_new_tokens) + " new tokens after " +
                                   std::to_string(P) + " do not fit " + std::to_string(cache_.max_positions()));
  TargetResult r;
  const auto t0 = std::chrono::steady_clock::now();
  r.tokens.push_back(Argmax(prompt_logits_.data(), c.vocab_size));
  logits_.resize(c.vocab_size);
  while (r.tokens.size() < max_new_tokens) {
    if (stop_at_eos && model_.tokenizer && model_.tokenizer->IsEndOfGeneration(r.tokens.back())) break;
    const int last = r.tokens.back();
    target_.Forward(std::span<const int>(&last, 1), P + static_cast<uint32_t>(r.tokens.size()) - 1, cache_, logits_.data());
    r.tokens.push_back(Argmax(logits_.data(), c.vocab_size));
  }
  r.decode_ms = Ms(t0, std::chrono::steady_clock::now());
  return r;
}

void SelfSpeculativeDecoder::Select(uint32_t frontier, uint32_t keep, const SpeculativeOptions& o, uint64_t& evals) {
  const model::Config& c = model_.config;
  const int hs = c.head_size(), nkv = c.n_kv_heads, nh = c.n_heads;
  const uint32_t obs = std::min(o.obs_window, frontier);
  std::vector<float> k(size_t(nkv) * frontier * hs), q(size_t(nh) * obs * hs);
  std::vector<uint32_t> qpos(obs);
  for (uint32_t j = 0; j < obs; ++j) qpos[j] = frontier - obs + j;
  std::vector<float> scores;
  std::vector<uint32_t> order;
  for (int l = 0; l < c.n_layers; ++l) {
    for (uint32_t t = 0; t < frontier; ++t)
      for (int h = 0; h < nkv; ++h)
        std::memcpy(k.data() + (size_t(h) * frontier + t) * hs, cache_.k(l, t) + h * hs, hs * sizeof(float));
    for (uint32_t j = 0; j < obs; ++j) {
      const size_t slot = size_t(l) * ring_ + qpos[j] % ring_;
      for (int h = 0; h < nh; ++h)
        std::memcpy(q.data() + (size_t(h) * obs + j) * hs, queries_.data() + slot * c.dim + h * hs, hs * sizeof(float));
    }
    attention::LayerKv kv;
    kv.n_heads = nh;
    kv.n_kv_heads = nkv;
    kv.head_dim = hs;
    kv.n_tokens = frontier;
    kv.k = k;
    kv.recent = attention::QueryBlock{q, qpos};
    attention::HeadScores hsc;
    hsc.n_kv_heads = nkv;
    hsc.n_tokens = frontier;
    hsc.s.assign(size_t(nkv) * frontier, 0.0f);
    attention::AccumulateAttention(kv, kv.recent, hsc.s);
    attention::MaxPool(hsc, o.pool_kernel);
    for (uint32_t j = 0; j < obs; ++j) evals += uint64_t(nh) * std::min(frontier, qpos[j] + 1);
    for (int h = 0; h < nkv; ++h) {
      const float* s = hsc.head(h);
      order.resize(frontier);
      std::iota(order.begin(), order.end(), 0u);
      const uint32_t m = std::min(keep, frontier);
      std::partial_sort(order.begin(), order.begin() + m, order.end(),
                        [&](uint32_t a, uint32_t b) { return s[a] != s[b] ? s[a] > s[b] : a > b; });
      std::vector<uint32_t>& sel = selected_[size_t(l) * nkv + h];
      sel.assign(order.begin(), order.begin() + m);
      std::sort(sel.begin(), sel.end());
    }
  }
}

void SelfSpeculativeDecoder::DraftAttention(int layer, uint32_t pos0, uint32_t n, const float* q,
                                            const model::KvCache& cache, float* o) {
  const model::Config& c = model_.config;
  const int hs = c.head_size(), group = c.n_heads / c.n_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (uint32_t t = 0; t < n; ++t) {
    const uint32_t pos = pos0 + t, w0 = pos + 1 > window_ ? pos + 1 - window_ : 0;
    for (int h = 0; h < c.n_heads; ++h) {
      const int kvh = h / group;
      const std::vector<uint32_t>& sel = selected_[size_t(layer) * c.n_kv_heads + kvh];
      const size_t ns = std::lower_bound(sel.begin(), sel.end(), w0) - sel.begin();
      const size_t total = ns + (pos + 1 - w0);
      scores_.resize(total);
      const float* qh = q + size_t(t) * c.dim + h * hs;
      auto key = [&](size_t i) { return i < ns ? sel[i] : w0 + static_cast<uint32_t>(i - ns); };
      float m = -INFINITY;
      for (size_t i = 0; i < total; ++i) {
        scores_[i] = model::fp::Dot(qh, cache.k(layer, key(i)) + kvh * hs, hs) * scale;
        m = std::max(m, scores_[i]);
      }
      float z = 0;
      for (size_t i = 0; i < total; ++i) z += (scores_[i] = std::exp(scores_[i] - m));
      float* oh = o + size_t(t) * c.dim + h * hs;
      std::fill(oh, oh + hs, 0.0f);
      for (size_t i = 0; i < total; ++i) {
        const float w = scores_[i] / z;
        const float* v = cache.v(layer, key(i)) + kvh * hs;
        for (int x = 0; x < hs; ++x) oh[x] += w * v[x];
      }
    }
  }
}

Result<SpeculativeResult> SelfSpeculativeDecoder::Speculative(const SpeculativeOptions& o) {
  using Clock = std::chrono::steady_clock;
  const model::Config& c = model_.config;
  if (prompt_.empty()) return Status::FailedPrecondition("speculative: Speculative before Prefill");
  const uint32_t P = static_cast<uint32_t>(prompt_.size());
  const uint32_t budget = o.kv_budget != 0 ? o.kv_budget : std::max(o.window + 1, P / 4);
  if (o.gamma == 0) return Status::InvalidArgument("speculative: gamma must be >= 1, got 0");
  if (o.max_new_tokens == 0) return Status::InvalidArgument("speculative: max_new_tokens must be >= 1, got 0");
  if (o.window == 0 || o.window >= budget)
    return Status::InvalidArgument("speculative: window must be in [1, kv_budget), got " + std::to_string(o.window) +
                                   " with kv_budget " + std::to_string(budget));
  if (o.obs_window == 0 || o.obs_window + o.gamma + 1 > kRing)
    return Status::InvalidArgument("speculative: obs_window + gamma + 1 must be in [2, " + std::to_string(kRing) +
                                   "], got obs_window " + std::to_string(o.obs_window) + ", gamma " + std::to_string(o.gamma));
  if (o.refresh == RefreshMode::kEveryN && o.refresh_every == 0)
    return Status::InvalidArgument("speculative: refresh_every must be >= 1 with refresh=every");
  if (uint64_t{P} + o.max_new_tokens + o.gamma + 1 > cache_.max_positions())
    return Status::InvalidArgument("speculative: prompt " + std::to_string(P) + " + " + std::to_string(o.max_new_tokens) +
                                   " tokens + gamma + 1 exceed " + std::to_string(cache_.max_positions()) + " positions");
  SpeculativeResult r;
  r.kv_budget = budget;
  window_ = o.window;
  auto t = Clock::now();
  Select(P, budget - o.window, o, r.prefill_score_evals);
  r.refresh_ms += Ms(t, Clock::now());
  const auto start = Clock::now();
  const uint32_t G = o.gamma;
  r.tokens.push_back(Argmax(prompt_logits_.data(), c.vocab_size));
  auto ended = [&] {
    return o.stop_at_eos && model_.tokenizer && model_.tokenizer->IsEndOfGeneration(r.tokens.back());
  };
  uint32_t p = P, since = 0;  // p: position of the last emitted token (not yet run)
  std::vector<int> chunk(G + 1);
  logits_.resize(size_t(G + 1) * c.vocab_size);
  x_.resize(size_t(G + 1) * c.dim);
  while (r.tokens.size() < o.max_new_tokens && !ended()) {
    // Draft gamma tokens.
    t = Clock::now();
    chunk[0] = r.tokens.back();
    for (uint32_t i = 0; i < G; ++i) {
      drafter_.Forward(std::span<const int>(&chunk[i], 1), p + i, cache_, logits_.data());
      chunk[i + 1] = Argmax(logits_.data(), c.vocab_size);
    }
    const auto drafted = Clock::now();
    r.draft_ms += Ms(t, drafted);
    // Verify them in one target chunk.
    target_.Embed(chunk, x_.data());
    for (int l = 0; l < c.n_layers; ++l) target_.Layer(l, p, G + 1, x_.data(), cache_);
    target_.Logits(x_.data(), logits_.data(), static_cast<int>(G + 1));
    uint32_t a = 0;
    while (a < G && chunk[a + 1] == Argmax(logits_.data() + size_t(a) * c.vocab_size, c.vocab_size)) ++a;
    r.verify_ms += Ms(drafted, Clock::now());
    uint32_t emitted = 0;
    for (uint32_t i = 0; i <= a && r.tokens.size() < o.max_new_tokens && !ended(); ++i, ++emitted)
      r.tokens.push_back(i < a ? chunk[i + 1] : Argmax(logits_.data() + size_t(a) * c.vocab_size, c.vocab_size));
    ++r.steps;
    r.emitted_in_steps += a + 1;
    r.emitted_per_step.push_back(static_cast<uint8_t>(a + 1));
    p += emitted;
    since += emitted;
    bool refresh = false;
    if (o.refresh == RefreshMode::kEveryN) {
      refresh = since >= o.refresh_every;
    } else if (o.refresh == RefreshMode::kAdaptive && since >= o.adaptive_min_tokens &&
               r.emitted_per_step.size() >= o.adaptive_steps) {
      double sum = 0;
      for (size_t i = r.emitted_per_step.size() - o.adaptive_steps; i < r.emitted_per_step.size(); ++i)
        sum += r.emitted_per_step[i];
      refresh = sum / o.adaptive_steps < o.adaptive_threshold * (G + 1);
    }
    if (refresh && r.tokens.size() < o.max_new_tokens) {
      t = Clock::now();
      Select(p, budget - o.window, o, r.refresh_score_evals);
      r.refresh_ms += Ms(t, Clock::now());
      ++r.refreshes;
      since = 0;
    }
  }
  r.decode_ms = Ms(start, Clock::now());
  return r;
}

}  // namespace flatkv::engine
