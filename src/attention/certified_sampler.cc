#include "attention/certified_sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "attention/f16.h"
#include "common/random.h"

namespace flatkv::attention {

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
  const double eps = o.epsilon;
  std::vector<HeadCertificate> cert(n_heads);
  ParallelFor(o.decode.threads, static_cast<size_t>(cache.n_kv_heads), [&](size_t item) {
    const int kvh = static_cast<int>(item);
    const float* qg = q.data() + static_cast<size_t>(kvh) * group * d;
    const float* vn = index.vnorm.data() + static_cast<size_t>(kvh) * n;
    const uint16_t* v = cache.v_row(kvh, 0);
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
    // 2. The race's noise, shared by the group's heads (each head's
    //    inclusions are still independent across keys): r = max(1/E, 1/cap).
    std::vector<float> r(n);
    const auto seed = static_cast<uint32_t>(SplitMix64(o.seed * 0x100000001B3ull + static_cast<uint64_t>(kvh)));
    k.race_rates(seed, 0, n, static_cast<float>(1.0 / o.cap), r.data());
    float vmax = 0;
    for (uint32_t i = 0; i < n; ++i) vmax = std::max(vmax, vn[i]);
    std::vector<uint32_t> idx(n);
    std::vector<float> coef(n), acc(d);
    for (int g = 0; g < group; ++g) {
      const int h = kvh * group + g;
      float* wh = w.data() + static_cast<size_t>(g) * n;
      k.exp_shift(wh, n, *std::max_element(wh, wh + n));
      double z = 0, wv = 0, wvv = 0;
      k.weight_sums(wh, vn, n, &z, &wv, &wvv);
      // Bernstein radius at level l (tau = 2^-l): sigma^2 <= tau * sum over
      // w < cap tau of w ||v||^2 (h <= 1), L = cap tau max ||v||. Both fall
      // with l, so the radius does too.
      auto radius = [&](int l) {
        const double tau = std::ldexp(1.0, -l);
        const double sigma2 = tau * k.masked_wvv(wh, vn, n, static_cast<float>(o.cap * tau));
        return BernsteinRadius(sigma2, o.cap * tau * vmax, p_level);
      };
      // The first level whose radius could certify when ||N|| <= upper.
      auto first_level = [&](int from, double upper) {
        int lo = from, hi = o.levels;  // answer in [lo, hi]; hi = none
        while (lo < hi) {
          const int mid = (lo + hi) / 2;
          if (radius(mid) * (1 + eps) <= eps * upper) hi = mid;
          else lo = mid + 1;
        }
        return lo;
      };
      HeadCertificate& c = cert[h];
      bool done = false;
      double upper = wv;  // ||N|| <= sum w ||v||
      int l = o.force_level >= 0 ? o.force_level : first_level(0, upper);
      while (l < o.levels && !done) {
        // Any stopping rule is covered: the union bound holds for every level at once.
        const double tau = std::ldexp(1.0, -l), t = radius(l);
        const uint32_t m = k.select(wh, r.data(), n, static_cast<float>(tau), idx.data());
        for (uint32_t s = 0; s < m; ++s) {  // Horvitz-Thompson weights w / pi
          const double x = wh[idx[s]] / tau;
          const double pi = wh[idx[s]] >= o.cap * tau ? 1.0 : -std::expm1(-x);
          coef[s] = static_cast<float>(wh[idx[s]] / pi);
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        k.gather(idx.data(), coef.data(), m, v, d, acc.data());
        double norm = 0;
        for (float a : acc) norm += double(a) * a;
        norm = std::sqrt(norm);
        const bool ok = t * (1 + eps) <= eps * norm;
        if (ok || o.force_level >= 0) {
          c = HeadCertificate{l, m, norm > t ? t / (norm - t) : INFINITY, ok};
          for (int j = 0; j < d; ++j) out[static_cast<size_t>(h) * d + j] = static_cast<float>(acc[j] / z);
          done = true;
          break;
        }
        upper = std::min(upper, norm + t);  // ||N|| < ||N^|| + t on the good event
        l = first_level(l + 1, upper);
      }
      if (done) continue;
      // Exact fallback: every value row.
      for (uint32_t i = 0; i < n; ++i) idx[i] = i;
      std::fill(acc.begin(), acc.end(), 0.0f);
      k.gather(idx.data(), wh, n, v, d, acc.data());
      c = HeadCertificate{-1, n, 0.0, true};
      for (int j = 0; j < d; ++j) out[static_cast<size_t>(h) * d + j] = static_cast<float>(acc[j] / z);
    }
  });
  if (certs) *certs = std::move(cert);
  return Status::Ok();
}

}  // namespace flatkv::attention
