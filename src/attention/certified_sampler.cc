#include "attention/certified_sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "attention/f16.h"

namespace flatkv::attention {
namespace {

uint64_t SplitMix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// h(x) = x / (e^x - 1), h(0) = 1.
double H(double x) { return x < 1e-12 ? 1.0 : x / std::expm1(x); }

}  // namespace

double BernsteinRadius(double sigma2, double L, double p) {
  const double c = std::log(2.0 / p), a = 2.0 / 3.0 * L * c;
  return (a + std::sqrt(a * a + 8.0 * sigma2 * c)) / 2.0;
}

Result<SamplerIndex> BuildSamplerIndex(const F16Cache& cache) {
  if (cache.n_tokens == 0 || cache.n_kv_heads <= 0 || cache.head_dim <= 0)
    return Status::InvalidArgument("sampler: empty cache");
  SamplerIndex ix;
  ix.vnorm.resize(static_cast<size_t>(cache.n_kv_heads) * cache.n_tokens);
  for (int h = 0; h < cache.n_kv_heads; ++h)
    for (uint32_t t = 0; t < cache.n_tokens; ++t) {
      double s = 0;
      for (int j = 0; j < cache.head_dim; ++j) {
        const double x = HalfToFloat(cache.v_row(h, t)[j]);
        s += x * x;
      }
      ix.vnorm[static_cast<size_t>(h) * cache.n_tokens + t] = static_cast<float>(std::sqrt(s));
    }
  return ix;
}

Status CertifiedDecode(const F16Cache& cache, const SamplerIndex& index, int n_heads, std::span<const float> q,
                       std::span<float> out, const SamplerOptions& o, std::vector<HeadCertificate>* certs) {
  FLATKV_RETURN_IF_ERROR(cache.Validate(n_heads, q.size(), out.size()));
  if (index.vnorm.size() != static_cast<size_t>(cache.n_kv_heads) * cache.n_tokens)
    return Status::InvalidArgument("sampler: index has " + std::to_string(index.vnorm.size()) + " norms for " +
                                   std::to_string(cache.n_kv_heads) + " x " + std::to_string(cache.n_tokens));
  if (!(o.epsilon > 0 && o.epsilon < 1) || !(o.delta > 0 && o.delta < 1) || o.levels < 1 || o.levels > 120 ||
      !(o.cap >= 1) || o.force_level >= o.levels)
    return Status::InvalidArgument("sampler: epsilon " + std::to_string(o.epsilon) + ", delta " +
                                   std::to_string(o.delta) + ", levels " + std::to_string(o.levels) + ", cap " +
                                   std::to_string(o.cap) + " (expected (0,1), (0,1), 1..120, >= 1)");
  const DecodeKernels& k = KernelsFor(std::min(o.decode.simd, DetectedSimd()));
  const int group = n_heads / cache.n_kv_heads, d = cache.head_dim;
  const uint32_t n = cache.n_tokens;
  const double p_level = o.delta / o.levels;  // union bound over the grid
  std::vector<HeadCertificate> cert(n_heads);
  ParallelFor(o.decode.threads, static_cast<size_t>(cache.n_kv_heads), [&](size_t item) {
    const int kvh = static_cast<int>(item);
    const float* qg = q.data() + static_cast<size_t>(kvh) * group * d;
    const float* vn = index.vnorm.data() + static_cast<size_t>(kvh) * n;
    // 1. Every score, in chunks (the kernel writes [G][chunk]).
    std::vector<float> w(static_cast<size_t>(group) * n), tmp;
    constexpr uint32_t kChunk = 2048;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    for (uint32_t t0 = 0; t0 < n; t0 += kChunk) {
      const uint32_t m = std::min(kChunk, n - t0);
      tmp.resize(static_cast<size_t>(group) * m);
      k.scores(qg, group, cache.k_row(kvh, t0), m, d, scale, tmp.data());
      for (int h = 0; h < group; ++h) std::copy_n(tmp.data() + size_t(h) * m, m, w.data() + size_t(h) * n + t0);
    }
    // 2. The race's noise, shared by the group: r_i = max(1 / E_i, 1 / cap).
    std::vector<float> r(n);
    const uint64_t stream = SplitMix(o.seed ^ (uint64_t(kvh) << 48));
    for (uint32_t i = 0; i < n; ++i) {
      const double u = (static_cast<double>(SplitMix(stream + i) >> 11) + 0.5) * 0x1.0p-53;  // (0, 1)
      r[i] = static_cast<float>(std::max(1.0 / -std::log(u), 1.0 / o.cap));
    }
    float vmax = 0;
    for (uint32_t i = 0; i < n; ++i) vmax = std::max(vmax, vn[i]);
    std::vector<uint8_t> lev(n);
    std::vector<double> acc(d);
    for (int g = 0; g < group; ++g) {
      const int h = kvh * group + g;
      float* wh = w.data() + static_cast<size_t>(g) * n;
      k.exp_shift(wh, n, *std::max_element(wh, wh + n));
      double z = 0, wv = 0, buckets[256] = {};
      k.sampler_pass(wh, r.data(), vn, n, lev.data(), &z, &wv, buckets);
      HeadCertificate& c = cert[h];
      bool done = false;
      for (int l = 0; l < o.levels && !done; ++l) {
        if (o.force_level >= 0 && l != o.force_level) continue;
        const double tau = std::ldexp(1.0, -l);
        double sigma2 = 0;
        for (int b = 0; b < 256; ++b) {
          if (buckets[b] == 0) continue;
          const double lo = std::bit_cast<float>(static_cast<uint32_t>(b) << 22);
          if (lo >= o.cap * tau) continue;  // always read: no variance
          sigma2 += tau * buckets[b] * H(lo / tau);
        }
        const double t = BernsteinRadius(sigma2, o.cap * tau * vmax, p_level);
        // Skip levels that cannot certify even if ||N^|| reached sum w ||v||
        // (a deterministic choice, so the union bound still covers it).
        if (o.force_level < 0 && t * (1 + o.epsilon) > o.epsilon * wv) continue;
        std::fill(acc.begin(), acc.end(), 0.0);
        uint32_t sampled = 0;
        for (uint32_t i = 0; i < n; ++i) {
          if (lev[i] > l) continue;
          const double wi = wh[i], pi = wi >= o.cap * tau ? 1.0 : -std::expm1(-wi / tau);
          const double f = wi / pi;
          const uint16_t* row = cache.v_row(kvh, i);
          for (int j = 0; j < d; ++j) acc[j] += f * HalfToFloat(row[j]);
          ++sampled;
        }
        double norm = 0;
        for (double a : acc) norm += a * a;
        norm = std::sqrt(norm);
        const bool ok = t * (1 + o.epsilon) <= o.epsilon * norm;
        if (!ok && o.force_level < 0) continue;
        c.level = l;
        c.sampled = sampled;
        c.bound = norm > t ? t / (norm - t) : INFINITY;
        c.certified = ok;
        for (int j = 0; j < d; ++j) out[static_cast<size_t>(h) * d + j] = static_cast<float>(acc[j] / z);
        done = true;
      }
      if (done) continue;
      // Exact fallback: every value row.
      std::fill(acc.begin(), acc.end(), 0.0);
      for (uint32_t i = 0; i < n; ++i) {
        const uint16_t* row = cache.v_row(kvh, i);
        for (int j = 0; j < d; ++j) acc[j] += double(wh[i]) * HalfToFloat(row[j]);
      }
      c = HeadCertificate{-1, n, 0.0, true};
      for (int j = 0; j < d; ++j) out[static_cast<size_t>(h) * d + j] = static_cast<float>(acc[j] / z);
    }
  });
  if (certs) *certs = std::move(cert);
  return Status::Ok();
}

}  // namespace flatkv::attention
