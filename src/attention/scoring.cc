#include "attention/scoring.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace flatkv::attention {
namespace {

constexpr float kKeep = std::numeric_limits<float>::infinity();
constexpr uint32_t kSeesAll = std::numeric_limits<uint32_t>::max();

Status CheckQueries(const LayerKv& kv, const QueryBlock& b, const char* what) {
  if (b.q.size() != static_cast<size_t>(kv.n_heads) * b.positions.size() * kv.head_dim)
    return Status::InvalidArgument(std::string("scoring: ") + what + " has " + std::to_string(b.q.size()) +
                                   " floats, expected n_heads*queries*head_dim = " +
                                   std::to_string(size_t(kv.n_heads) * b.positions.size() * kv.head_dim));
  return Status::Ok();
}

// The last `window` queries of `b` (its layout is q[h][j][d], so a suffix is
// a strided view: copy it).
struct OwnedBlock {
  std::vector<float> q;
  std::vector<uint32_t> pos;
  QueryBlock view() const { return {q, pos}; }
};

OwnedBlock Suffix(const LayerKv& kv, const QueryBlock& b, uint32_t window) {
  const size_t n = b.positions.size(), w = std::min<size_t>(window, n), d = kv.head_dim;
  OwnedBlock o;
  o.pos.assign(b.positions.end() - static_cast<std::ptrdiff_t>(w), b.positions.end());
  o.q.resize(kv.n_heads * w * d);
  for (int h = 0; h < kv.n_heads; ++h)
    std::copy_n(b.q.data() + (h * n + (n - w)) * d, w * d, o.q.data() + h * w * d);
  return o;
}

HeadScores Zeros(const LayerKv& kv) {
  HeadScores s;
  s.n_kv_heads = kv.n_kv_heads;
  s.n_tokens = kv.n_tokens;
  s.s.assign(static_cast<size_t>(kv.n_kv_heads) * kv.n_tokens, 0.0f);
  return s;
}

// Forces keys at positions >= first_pos to be kept.
void KeepFrom(const LayerKv& kv, uint32_t first_pos, HeadScores& s) {
  for (int h = 0; h < kv.n_kv_heads; ++h)
    for (uint32_t t = 0; t < kv.n_tokens; ++t)
      if (kv.KeyPos(t) >= first_pos) s.head(h)[t] = kKeep;
}

class StreamingScorer final : public Scorer {
 public:
  explicit StreamingScorer(uint32_t sinks) : sinks_(sinks) {}
  std::string name() const override { return "streaming"; }
  Result<HeadScores> Score(const LayerKv& kv, const ScoreContext&) const override {
    FLATKV_RETURN_IF_ERROR(kv.Validate());
    HeadScores s = Zeros(kv);
    for (int h = 0; h < kv.n_kv_heads; ++h)
      for (uint32_t t = 0; t < kv.n_tokens; ++t)  // sinks first, then by recency
        s.head(h)[t] = t < sinks_ ? kKeep : static_cast<float>(kv.KeyPos(t));
    return s;
  }

 private:
  uint32_t sinks_;
};

class H2oScorer final : public Scorer {
 public:
  explicit H2oScorer(double recent) : recent_(recent) {}
  std::string name() const override { return "h2o"; }
  bool uses_all_queries() const override { return true; }
  Result<HeadScores> Score(const LayerKv& kv, const ScoreContext&) const override {
    FLATKV_RETURN_IF_ERROR(kv.Validate());
    FLATKV_RETURN_IF_ERROR(CheckQueries(kv, kv.recent, "recent queries"));
    HeadScores s = Zeros(kv);
    AccumulateAttention(kv, kv.recent, s.s);
    const auto recent = static_cast<uint32_t>(std::ceil(recent_ * kv.n_tokens));
    if (recent > 0 && kv.n_tokens > 0) KeepFrom(kv, kv.KeyPos(kv.n_tokens - std::min(recent, kv.n_tokens)), s);
    return s;
  }

 private:
  double recent_;
};

class SnapKvScorer final : public Scorer {
 public:
  SnapKvScorer(uint32_t window, uint32_t kernel, Pool pool) : window_(window), kernel_(kernel), pool_(pool) {}
  std::string name() const override { return pool_ == Pool::kMax ? "snapkv" : "snapkv_avg"; }
  uint32_t recent_queries() const override { return window_; }
  Result<HeadScores> Score(const LayerKv& kv, const ScoreContext&) const override {
    FLATKV_RETURN_IF_ERROR(kv.Validate());
    FLATKV_RETURN_IF_ERROR(CheckQueries(kv, kv.recent, "recent queries"));
    if (kv.recent.positions.empty()) return Status::InvalidArgument("snapkv: no observation-window queries");
    const OwnedBlock win = Suffix(kv, kv.recent, window_);
    HeadScores s = Zeros(kv);
    AccumulateAttention(kv, win.view(), s.s);
    if (pool_ == Pool::kMax) {
      MaxPool(s, kernel_);
    } else {
      uint32_t before = 0;  // keys before the window
      while (before < kv.n_tokens && kv.KeyPos(before) < win.pos.front()) ++before;
      AvgPool(s, kernel_, before);
    }
    KeepFrom(kv, win.pos.front(), s);
    return s;
  }

 private:
  uint32_t window_, kernel_;
  Pool pool_;
};

// Normalises each head's row to sum 1 (rows of zeros stay zero).
void Normalise(HeadScores& s) {
  for (int h = 0; h < s.n_kv_heads; ++h) {
    double sum = 0;
    for (uint32_t t = 0; t < s.n_tokens; ++t) sum += s.head(h)[t];
    if (sum > 0)
      for (uint32_t t = 0; t < s.n_tokens; ++t) s.head(h)[t] = static_cast<float>(s.head(h)[t] / sum);
  }
}

class AgentKvScorer final : public Scorer {
 public:
  AgentKvScorer(bool use_max, uint32_t kernel) : max_(use_max), kernel_(kernel) {}
  std::string name() const override { return max_ ? "agentkv" : "agentkv_mean"; }
  Result<HeadScores> Score(const LayerKv& kv, const ScoreContext& ctx) const override {
    FLATKV_RETURN_IF_ERROR(kv.Validate());
    std::vector<QueryBlock> phases = ctx.phases;
    if (!kv.recent.positions.empty()) phases.push_back(kv.recent);
    if (phases.empty()) return Status::InvalidArgument("agentkv: no phase query buffers and no recent queries");
    HeadScores out = Zeros(kv);
    for (size_t p = 0; p < phases.size(); ++p) {
      FLATKV_RETURN_IF_ERROR(CheckQueries(kv, phases[p], "a phase buffer"));
      HeadScores s = Zeros(kv);
      AccumulateAttention(kv, phases[p], s.s);
      MaxPool(s, kernel_);
      Normalise(s);
      for (size_t i = 0; i < s.s.size(); ++i)
        out.s[i] = max_ ? std::max(out.s[i], s.s[i]) : out.s[i] + s.s[i] / static_cast<float>(phases.size());
    }
    if (!kv.recent.positions.empty()) {
      uint32_t first = kSeesAll;
      for (uint32_t p : kv.recent.positions) first = std::min(first, p);
      KeepFrom(kv, first, out);
    }
    return out;
  }

 private:
  bool max_;
  uint32_t kernel_;
};

class RehearsalScorer final : public Scorer {
 public:
  explicit RehearsalScorer(uint32_t kernel) : kernel_(kernel) {}
  std::string name() const override { return "rehearsal"; }
  Result<HeadScores> Score(const LayerKv& kv, const ScoreContext& ctx) const override {
    FLATKV_RETURN_IF_ERROR(kv.Validate());
    if (ctx.probes.positions.empty()) return Status::InvalidArgument("rehearsal: no probe queries");
    FLATKV_RETURN_IF_ERROR(CheckQueries(kv, ctx.probes, "probes"));
    HeadScores s = Zeros(kv);
    AccumulateAttention(kv, ctx.probes, s.s);
    MaxPool(s, kernel_);
    return s;
  }

 private:
  uint32_t kernel_;
};

}  // namespace

Status LayerKv::Validate() const {
  if (n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 || n_heads % n_kv_heads != 0)
    return Status::InvalidArgument("scoring: heads " + std::to_string(n_heads) + "/" + std::to_string(n_kv_heads) +
                                   " head_dim " + std::to_string(head_dim) +
                                   " (expected positive, n_heads a multiple of n_kv_heads)");
  const size_t rows = static_cast<size_t>(n_kv_heads) * n_tokens * head_dim;
  if (k.size() != rows)
    return Status::InvalidArgument("scoring: keys have " + std::to_string(k.size()) + " floats, expected " +
                                   std::to_string(rows));
  if (!v.empty() && v.size() != rows)
    return Status::InvalidArgument("scoring: values have " + std::to_string(v.size()) + " floats, expected " +
                                   std::to_string(rows));
  if (!key_pos.empty() && key_pos.size() != n_tokens)
    return Status::InvalidArgument("scoring: " + std::to_string(key_pos.size()) + " key positions for " +
                                   std::to_string(n_tokens) + " tokens");
  for (size_t t = 1; t < key_pos.size(); ++t)
    if (key_pos[t] <= key_pos[t - 1])
      return Status::InvalidArgument("scoring: key positions not ascending at " + std::to_string(t));
  return Status::Ok();
}

void AccumulateAttention(const LayerKv& kv, const QueryBlock& queries, std::span<float> out) {
  const int d = kv.head_dim, group = kv.group();
  const size_t nq = queries.positions.size();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const float weight = 1.0f / static_cast<float>(group * std::max<size_t>(nq, 1));
  std::vector<float> p(kv.n_tokens);
  for (int h = 0; h < kv.n_heads; ++h) {
    const int g = h / group;
    const float* kh = kv.k.data() + static_cast<size_t>(g) * kv.n_tokens * d;
    float* acc = out.data() + static_cast<size_t>(g) * kv.n_tokens;
    for (size_t j = 0; j < nq; ++j) {
      const float* q = queries.q.data() + (h * nq + j) * d;
      // Causal: keys at positions <= the query's (key positions ascend).
      uint32_t len = kv.n_tokens;
      while (len > 0 && kv.KeyPos(len - 1) > queries.positions[j]) --len;
      if (len == 0) continue;
      float max = -INFINITY;
      for (uint32_t t = 0; t < len; ++t) {
        float dot = 0;
        for (int i = 0; i < d; ++i) dot += q[i] * kh[static_cast<size_t>(t) * d + i];
        p[t] = dot * scale;
        max = std::max(max, p[t]);
      }
      double sum = 0;
      for (uint32_t t = 0; t < len; ++t) sum += (p[t] = std::exp(p[t] - max));
      const float inv = static_cast<float>(1.0 / sum) * weight;
      for (uint32_t t = 0; t < len; ++t) acc[t] += p[t] * inv;
    }
  }
}

namespace {

// Replaces each of the first `n` entries of every head's row by `reduce` over
// its window [t - kernel/2, t + kernel/2], clipped to [0, n).
template <class Reduce>
void Pool1d(HeadScores& scores, uint32_t kernel, uint32_t n, Reduce reduce) {
  n = std::min(n, scores.n_tokens);
  if (kernel <= 1 || n == 0) return;
  const uint32_t r = kernel / 2;
  std::vector<float> row(n);
  for (int h = 0; h < scores.n_kv_heads; ++h) {
    float* s = scores.head(h);
    std::copy_n(s, n, row.begin());
    for (uint32_t t = 0; t < n; ++t) {
      const uint32_t a = t >= r ? t - r : 0, b = std::min(n - 1, t + r);
      s[t] = reduce(row.data() + a, row.data() + b + 1);
    }
  }
}

}  // namespace

void MaxPool(HeadScores& scores, uint32_t kernel) {
  Pool1d(scores, kernel, scores.n_tokens, [](const float* a, const float* b) { return *std::max_element(a, b); });
}

void AvgPool(HeadScores& scores, uint32_t kernel, uint32_t n) {
  Pool1d(scores, kernel, n, [kernel](const float* a, const float* b) {
    double sum = 0;  // zero padding: the missing entries add nothing, the divisor stays `kernel`
    for (const float* p = a; p != b; ++p) sum += *p;
    return static_cast<float>(sum / kernel);
  });
}

std::unique_ptr<Scorer> MakeStreamingScorer(uint32_t sinks) { return std::make_unique<StreamingScorer>(sinks); }
std::unique_ptr<Scorer> MakeH2oScorer(double recent_fraction) { return std::make_unique<H2oScorer>(recent_fraction); }
std::unique_ptr<Scorer> MakeSnapKvScorer(uint32_t window, uint32_t kernel, Pool pool) {
  return std::make_unique<SnapKvScorer>(window, kernel, pool);
}
std::unique_ptr<Scorer> MakeAgentKvScorer(bool use_max, uint32_t kernel) {
  return std::make_unique<AgentKvScorer>(use_max, kernel);
}
std::unique_ptr<Scorer> MakeRehearsalScorer(uint32_t kernel) { return std::make_unique<RehearsalScorer>(kernel); }

}  // namespace flatkv::attention
