#include "attention/synthetic.h"

#include <algorithm>
#include <cmath>

#include "attention/f16.h"

namespace flatkv::attention {
namespace {

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x1234567ull) {}
  uint64_t Next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  float Uniform() { return static_cast<float>(Next() >> 40) * 0x1.0p-24f; }
  // Approximately N(0, 1): the sum of four uniforms, rescaled (fast; the
  // tails are light, which is fine for a synthetic bulk).
  float Normal() { return (Uniform() + Uniform() + Uniform() + Uniform() - 2.0f) * 1.7320508f; }
};

}  // namespace

F16Cache SyntheticCache::View(uint32_t n) const {
  F16Cache c;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = head_dim;
  c.n_tokens = std::min(n, capacity);
  c.head_stride = capacity;
  c.k = k.data();
  c.v = v.data();
  return c;
}

SyntheticCache MakeSyntheticCache(const SyntheticOptions& o) {
  SyntheticCache c;
  c.n_kv_heads = o.n_kv_heads;
  c.head_dim = o.head_dim;
  c.capacity = o.n_tokens;
  const int d = o.head_dim, group = o.n_heads / o.n_kv_heads;
  const uint32_t n = o.n_tokens;
  c.k.resize(static_cast<size_t>(o.n_kv_heads) * n * d);
  c.v.resize(c.k.size());
  c.q.resize(static_cast<size_t>(o.n_heads) * d);
  // Per KV head: a unit direction u; queries q_h = sqrt(d) (0.95 u + 0.31 noise).
  std::vector<float> u(static_cast<size_t>(o.n_kv_heads) * d);
  for (int g = 0; g < o.n_kv_heads; ++g) {
    Rng rng(o.seed * 1000 + g);
    float* ug = u.data() + size_t(g) * d;
    double norm = 0;
    for (int j = 0; j < d; ++j) {
      ug[j] = rng.Normal();
      norm += double(ug[j]) * ug[j];
    }
    for (int j = 0; j < d; ++j) ug[j] = static_cast<float>(ug[j] / std::sqrt(norm));
    for (int i = 0; i < group; ++i) {
      float* q = c.q.data() + size_t(g * group + i) * d;
      double qn = 0;
      for (int j = 0; j < d; ++j) {
        q[j] = 0.95f * ug[j] + 0.31f * rng.Normal() / std::sqrt(float(d));
        qn += double(q[j]) * q[j];
      }
      for (int j = 0; j < d; ++j) q[j] = static_cast<float>(q[j] / std::sqrt(qn) * std::sqrt(double(d)));
    }
  }
  ParallelFor(o.threads, static_cast<size_t>(o.n_kv_heads), [&](size_t item) {
    const int g = static_cast<int>(item);
    Rng rng(o.seed * 7919 + g + 1);
    const float* ug = u.data() + size_t(g) * d;
    const float conc = o.n_kv_heads == 1 ? 1.0f
                                          : o.dispersed_scale + (1.0f - o.dispersed_scale) * g / (o.n_kv_heads - 1);
    std::vector<float> extra(n, 0.0f);  // logit added along u
    for (uint32_t t = 0; t < std::min(o.sinks, n); ++t) extra[t] = o.sink_logit * conc;
    for (uint32_t i = 0; i < o.heavy && n > o.sinks + o.local; ++i) {
      const uint32_t t = o.sinks + static_cast<uint32_t>(rng.Next() % (n - o.sinks - o.local));
      extra[t] = (o.heavy_logit - 2.0f + 4.0f * rng.Uniform()) * conc;
    }
    const uint32_t local = std::min(o.local, n);
    for (uint32_t i = 0; i < local; ++i)
      extra[n - local + i] = std::max(extra[n - local + i], (o.local_logit - 4.0f * (local - 1 - i) / std::max(1u, local)) * conc);
    // q . u ~= 0.95 sqrt(d), so a logit shift L needs L / 0.95 along u.
    for (uint32_t t = 0; t < n; ++t) {
      uint16_t* k = c.k.data() + (size_t(g) * n + t) * d;
      uint16_t* v = c.v.data() + (size_t(g) * n + t) * d;
      const float a = extra[t] / 0.95f;
      for (int j = 0; j < d; ++j) {
        k[j] = FloatToHalf(o.bulk_std * rng.Normal() + a * ug[j]);
        v[j] = FloatToHalf(rng.Normal());
      }
    }
  });
  return c;
}

}  // namespace flatkv::attention
