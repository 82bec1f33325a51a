// The synthetic sparse-prefill prompt (attention/rbs_synthetic.h).
#include "attention/rbs_synthetic.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "model/rope.h"

namespace flatkv::attention {
namespace {

// A unit vector in the last `slow` channels (the slowest RoPE pairs of an interleaved head).
std::vector<float> SlowDirection(std::mt19937_64& rng, int d, int slow) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> v(d, 0.0f);
  float n2 = 0;
  for (int x = d - slow; x < d; ++x) {
    v[x] = g(rng);
    n2 += v[x] * v[x];
  }
  for (float& x : v) x /= std::sqrt(n2);
  return v;
}

}  // namespace

PrefillSynthetic MakePrefillSynthetic(const PrefillSyntheticOptions& o, const std::vector<uint32_t>& qblocks) {
  PrefillSynthetic s;
  s.heads = o.heads;
  s.head_dim = o.head_dim;
  s.n_tokens = o.n_tokens;
  s.qblocks = qblocks;
  const int d = o.head_dim;
  const uint32_t n = o.n_tokens, B = o.block;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int slow = std::min(d, 8);
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::uniform_int_distribution<uint32_t> offset(0, B - 1);
  // Needles: one per needle_every key blocks, shared positions across heads, own directions per head.
  for (uint32_t j = 1; j * B < n; j += o.needle_every) s.needles.push_back(std::min(n - 1, j * B + offset(rng)));
  s.k.assign(uint64_t(o.heads) * n * d, 0.0f);
  s.v.resize(s.k.size());
  const uint64_t rows = uint64_t(qblocks.size()) * B;
  s.q.assign(uint64_t(o.heads) * rows * d, 0.0f);
  std::vector<uint32_t> key_pos(n), q_pos(rows);
  for (uint32_t t = 0; t < n; ++t) key_pos[t] = t;
  for (size_t b = 0; b < qblocks.size(); ++b)
    for (uint32_t r = 0; r < B; ++r) q_pos[b * B + r] = std::min(n - 1, qblocks[b] * B + r);
  const model::RopeSpec rope{o.rope_theta, 0, model::RopeStyle::kInterleaved};
  for (int h = 0; h < o.heads; ++h) {
    const float local_factor = 0.7f + 0.6f * static_cast<float>(h) / std::max(1, o.heads - 1);  // 0.7 .. 1.3
    const bool retrieval = h + 1 < o.heads || o.heads == 1;
    const float needle_factor = 1.0f - 0.15f * static_cast<float>(h);
    // mu: a unit direction over every channel; a * b * scale = local logit.
    std::vector<float> mu(d, 0.0f);
    float n2 = 0;
    for (int x = 0; x < std::max(2, d / 2); ++x) {
      mu[x] = g(rng);
      n2 += mu[x] * mu[x];
    }
    for (float& x : mu) x /= std::sqrt(n2);
    const float ab = std::sqrt(o.local_logit * local_factor / scale);
    const std::vector<float> sink = SlowDirection(rng, d, slow);
    const float sink_amp = std::sqrt(o.sink_logit / scale);  // the same amplitude on q and k
    const float needle_key = 16.0f, needle_q = o.needle_logit * needle_factor / (needle_key * scale);
    std::vector<std::vector<float>> needle_dir;
    for (size_t i = 0; i < s.needles.size(); ++i) needle_dir.push_back(SlowDirection(rng, d, slow));
    float* K = s.k.data() + uint64_t(h) * n * d;
    float* V = s.v.data() + uint64_t(h) * n * d;
    for (uint32_t t = 0; t < n; ++t) {
      float* k = K + uint64_t(t) * d;
      for (int x = 0; x < d; ++x) k[x] = ab * mu[x] + o.noise * g(rng);
      if (t < o.sinks)
        for (int x = 0; x < d; ++x) k[x] += sink_amp * sink[x];
      for (int x = 0; x < d; ++x) V[uint64_t(t) * d + x] = g(rng);
    }
    for (size_t i = 0; i < s.needles.size(); ++i) {
      float* k = K + uint64_t(s.needles[i]) * d;
      for (int x = 0; x < d; ++x) k[x] += needle_key * needle_dir[i][x];
    }
    model::ApplyRope(K, n, d, 0, 1, d, key_pos.data(), rope);
    float* Q = s.q.data() + uint64_t(h) * rows * d;
    for (size_t b = 0; b < qblocks.size(); ++b) {
      // The needle this query block seeks: a random one before it.
      int target = -1;
      uint32_t before = 0;
      while (before < s.needles.size() && s.needles[before] < qblocks[b] * B) ++before;
      if (retrieval && before > 0) target = static_cast<int>(std::uniform_int_distribution<uint32_t>(0, before - 1)(rng));
      for (uint32_t r = 0; r < B; ++r) {
        float* q = Q + (b * B + r) * d;
        if (qblocks[b] * B + r >= n) continue;  // past the prompt: left zero
        for (int x = 0; x < d; ++x) q[x] = ab * mu[x] + sink_amp * sink[x] + o.noise * g(rng);
        if (target >= 0)
          for (int x = 0; x < d; ++x) q[x] += needle_q * needle_dir[target][x];
      }
    }
    model::ApplyRope(Q, static_cast<uint32_t>(rows), d, 0, 1, d, q_pos.data(), rope);
  }
  return s;
}

}  // namespace flatkv::attention
