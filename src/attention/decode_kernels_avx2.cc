// AVX2 + FMA + F16C versions of the decode kernels (decode_kernels.h).
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>

#include "attention/avx2_math.h"
#include "attention/decode_kernels.h"
#include "attention/f16.h"

namespace flatkv::attention {
namespace {

using avx2::Exp8;
using avx2::HSum;

// Software prefetch a few rows ahead: one thread's streaming reads are
// bound by how many misses it keeps in flight, and this keeps more.
constexpr int kPrefetchRows = 8;
inline void Prefetch(const uint16_t* row, int d) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int off = 0; off < d * 2; off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
}

inline __m256 Load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }


float DotRow(const float* q, const uint16_t* row, int d) {
  __m256 acc = _mm256_setzero_ps();
  int j = 0;
  for (; j + 8 <= d; j += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + j), Load8(row + j), acc);
  float s = HSum(acc);
  for (; j < d; ++j) s += q[j] * HalfToFloat(row[j]);
  return s;
}

// Eight sums at once: out[i] = horizontal sum of a[i].
inline __m256 HSum8(const __m256* a) {
  const __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 h0123 = _mm256_hadd_ps(h01, h23), h4567 = _mm256_hadd_ps(h45, h67);
  return _mm256_add_ps(_mm256_permute2f128_ps(h0123, h4567, 0x20), _mm256_permute2f128_ps(h0123, h4567, 0x31));
}

// TB = 8 / G tokens at a time: eight independent FMA chains, and each q
// block loaded once for TB tokens.
template <int G>
void ScoresG(const float* q, const uint16_t* k, uint32_t n, int d, float scale, float* s) {
  constexpr int TB = 8 / G;
  const __m256 sc = _mm256_set1_ps(scale);
  uint32_t t = 0;
  if (d % 8 == 0) {
    for (; t + TB <= n; t += TB) {
      const uint16_t* row = k + size_t{t} * d;
      Prefetch(row + kPrefetchRows * d, TB * d);
      __m256 acc[8];
      for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
      for (int j = 0; j < d; j += 8) {
        __m256 kv[TB];
        for (int b = 0; b < TB; ++b) kv[b] = Load8(row + b * d + j);
        for (int h = 0; h < G; ++h) {
          const __m256 qv = _mm256_loadu_ps(q + h * d + j);
          for (int b = 0; b < TB; ++b) acc[b * G + h] = _mm256_fmadd_ps(qv, kv[b], acc[b * G + h]);
        }
      }
      alignas(32) float sums[8];
      _mm256_store_ps(sums, _mm256_mul_ps(HSum8(acc), sc));
      for (int b = 0; b < TB; ++b)
        for (int h = 0; h < G; ++h) s[static_cast<size_t>(h) * n + t + b] = sums[b * G + h];
    }
  }
  for (; t < n; ++t)
    for (int h = 0; h < G; ++h) s[static_cast<size_t>(h) * n + t] = scale * DotRow(q + h * d, k + size_t{t} * d, d);
}

void Scores(const float* q, int g, const uint16_t* k, uint32_t n, int d, float scale, float* s) {
  switch (g) {
    case 1: return ScoresG<1>(q, k, n, d, scale, s);
    case 2: return ScoresG<2>(q, k, n, d, scale, s);
    case 4: return ScoresG<4>(q, k, n, d, scale, s);
    case 8: return ScoresG<8>(q, k, n, d, scale, s);
    default: break;
  }
  const int d8 = d & ~7;
  for (uint32_t t = 0; t < n; ++t) {
    const uint16_t* row = k + size_t{t} * d;
    Prefetch(row + kPrefetchRows * d, d);
    __m256 acc[kMaxGroup];
    for (int h = 0; h < g; ++h) acc[h] = _mm256_setzero_ps();
    for (int j = 0; j < d8; j += 8) {
      const __m256 kv = Load8(row + j);
      for (int h = 0; h < g; ++h) acc[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * d + j), kv, acc[h]);
    }
    for (int h = 0; h < g; ++h) {
      float v = HSum(acc[h]);
      for (int j = d8; j < d; ++j) v += q[h * d + j] * HalfToFloat(row[j]);
      s[static_cast<size_t>(h) * n + t] = scale * v;
    }
  }
}

void ExpShift(float* x, uint32_t n, float m) {
  const __m256 mv = _mm256_set1_ps(m);
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, Exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv)));
  if (i < n) {
    float tail[8] = {};
    for (uint32_t j = i; j < n; ++j) tail[j - i] = x[j] - m;
    _mm256_storeu_ps(tail, Exp8(_mm256_loadu_ps(tail)));
    for (uint32_t j = i; j < n; ++j) x[j] = tail[j - i];
  }
}

// G heads x JB 8-channel blocks of accumulators stay in registers (G * JB
// <= 8) while the chunk's rows stream past; the rows are re-read per block
// group from L1/L2, which is far cheaper than a load and store of every
// accumulator per row.
template <int G, int JB>
void AccumulateTile(const float* p, uint32_t p_stride, const uint16_t* v, uint32_t n, int d, int j0, float* acc) {
  __m256 a[G][JB];
  for (int h = 0; h < G; ++h)
    for (int b = 0; b < JB; ++b) a[h][b] = _mm256_loadu_ps(acc + h * d + j0 + 8 * b);
  for (uint32_t t = 0; t < n; ++t) {
    const uint16_t* row = v + size_t{t} * d + j0;
    if (j0 == 0) Prefetch(row + kPrefetchRows * d, d);  // the first pass brings rows in
    __m256 vv[JB];
    for (int b = 0; b < JB; ++b) vv[b] = Load8(row + 8 * b);
    for (int h = 0; h < G; ++h) {
      const __m256 w = _mm256_broadcast_ss(p + static_cast<size_t>(h) * p_stride + t);
      for (int b = 0; b < JB; ++b) a[h][b] = _mm256_fmadd_ps(w, vv[b], a[h][b]);
    }
  }
  for (int h = 0; h < G; ++h)
    for (int b = 0; b < JB; ++b) _mm256_storeu_ps(acc + h * d + j0 + 8 * b, a[h][b]);
}

template <int G>
void AccumulateG(const float* p, uint32_t p_stride, const uint16_t* v, uint32_t n, int d, float* acc) {
  constexpr int JB = 8 / G;
  const int d8 = d & ~7;
  int j0 = 0;
  for (; j0 + 8 * JB <= d8; j0 += 8 * JB) AccumulateTile<G, JB>(p, p_stride, v, n, d, j0, acc);
  for (; j0 < d8; j0 += 8) AccumulateTile<G, 1>(p, p_stride, v, n, d, j0, acc);
  for (uint32_t t = 0; t < n && d8 < d; ++t)
    for (int j = d8; j < d; ++j) {
      const float vj = HalfToFloat(v[size_t{t} * d + j]);
      for (int h = 0; h < G; ++h) acc[h * d + j] += p[static_cast<size_t>(h) * p_stride + t] * vj;
    }
}

void Accumulate(const float* p, uint32_t p_stride, int g, const uint16_t* v, uint32_t n, int d, float* acc) {
  switch (g) {
    case 1: return AccumulateG<1>(p, p_stride, v, n, d, acc);
    case 2: return AccumulateG<2>(p, p_stride, v, n, d, acc);
    case 4: return AccumulateG<4>(p, p_stride, v, n, d, acc);
    case 8: return AccumulateG<8>(p, p_stride, v, n, d, acc);
    default: break;
  }
  const int d8 = d & ~7;
  for (uint32_t t = 0; t < n; ++t) {
    const uint16_t* row = v + size_t{t} * d;
    for (int j = 0; j < d8; j += 8) {
      const __m256 vv = Load8(row + j);
      for (int h = 0; h < g; ++h) {
        float* a = acc + h * d + j;
        _mm256_storeu_ps(a, _mm256_fmadd_ps(_mm256_set1_ps(p[static_cast<size_t>(h) * p_stride + t]), vv, _mm256_loadu_ps(a)));
      }
    }
    for (int j = d8; j < d; ++j) {
      const float vj = HalfToFloat(row[j]);
      for (int h = 0; h < g; ++h) acc[h * d + j] += p[static_cast<size_t>(h) * p_stride + t] * vj;
    }
  }
}


// ln(x) for x in (0, 1] (Cephes' logf polynomial), 8 lanes.
inline __m256 Log8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  __m256i xi = _mm256_castps_si256(x);
  __m256 e = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(xi, 23), _mm256_set1_epi32(127)));
  __m256 m = _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(xi, _mm256_set1_epi32(0x007FFFFF)),
                                                 _mm256_set1_epi32(0x3F800000)));  // [1, 2)
  const __m256 big = _mm256_cmp_ps(m, _mm256_set1_ps(1.41421356f), _CMP_GT_OQ);
  m = _mm256_blendv_ps(m, _mm256_mul_ps(m, _mm256_set1_ps(0.5f)), big);
  e = _mm256_add_ps(e, _mm256_and_ps(big, one));
  const __m256 f = _mm256_sub_ps(m, one);
  __m256 p = _mm256_set1_ps(7.0376836292e-2f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(-1.1514610310e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.1676998740e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(-1.2420140846e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.4249322787e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(-1.6668057665e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.0000714765e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(-2.4999993993e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(3.3333331174e-1f));
  const __m256 f2 = _mm256_mul_ps(f, f);
  __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, f), f2);
  y = _mm256_fmadd_ps(e, _mm256_set1_ps(-2.12194440e-4f), y);
  y = _mm256_fnmadd_ps(f2, _mm256_set1_ps(0.5f), y);
  return _mm256_fmadd_ps(e, _mm256_set1_ps(0.693359375f), _mm256_add_ps(f, y));
}

inline __m256i Hash8(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0x85EBCA6Bu)));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 13));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0xC2B2AE35u)));
  return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

void RaceRates(uint32_t seed, uint32_t i0, uint32_t n, float inv_cap, float* r) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 ic = _mm256_set1_ps(inv_cap);
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(i0 + i)), lane);
    const __m256i h = Hash8(_mm256_add_epi32(_mm256_mullo_epi32(idx, _mm256_set1_epi32(static_cast<int>(0x9E3779B1u))),
                                             _mm256_set1_epi32(static_cast<int>(seed))));
    const __m256 u = _mm256_mul_ps(_mm256_add_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(h, 8)), _mm256_set1_ps(0.5f)),
                                   _mm256_set1_ps(0x1.0p-24f));
    const __m256 e = _mm256_sub_ps(_mm256_setzero_ps(), Log8(u));
    _mm256_storeu_ps(r + i, _mm256_max_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), e), ic));
  }
  for (; i < n; ++i) {
    const float u = (static_cast<float>(Hash32(seed, i0 + i) >> 8) + 0.5f) * 0x1.0p-24f;
    r[i] = std::max(1.0f / -std::log(u), inv_cap);
  }
}

inline double HSumD(__m256 v) { return HSum(v); }

void WeightSums(const float* w, const float* vn, uint32_t n, double* z, double* wv, double* wvv) {
  // Float lanes per block of 1024, summed into doubles: no long float chains.
  double a = 0, b = 0, c = 0;
  for (uint32_t i0 = 0; i0 < n; i0 += 1024) {
    const uint32_t i1 = std::min(n, i0 + 1024);
    __m256 sa = _mm256_setzero_ps(), sb = sa, sc = sa;
    uint32_t i = i0;
    for (; i + 8 <= i1; i += 8) {
      const __m256 wi = _mm256_loadu_ps(w + i), vi = _mm256_loadu_ps(vn + i), wvi = _mm256_mul_ps(wi, vi);
      sa = _mm256_add_ps(sa, wi);
      sb = _mm256_add_ps(sb, wvi);
      sc = _mm256_fmadd_ps(wvi, vi, sc);
    }
    a += HSumD(sa);
    b += HSumD(sb);
    c += HSumD(sc);
    for (; i < i1; ++i) {
      a += w[i];
      b += double(w[i]) * vn[i];
      c += double(w[i]) * vn[i] * vn[i];
    }
  }
  *z += a;
  *wv += b;
  *wvv += c;
}

double MaskedWvv(const float* w, const float* vn, uint32_t n, float theta) {
  const __m256 th = _mm256_set1_ps(theta);
  double s = 0;
  for (uint32_t i0 = 0; i0 < n; i0 += 1024) {
    const uint32_t i1 = std::min(n, i0 + 1024);
    __m256 acc = _mm256_setzero_ps();
    uint32_t i = i0;
    for (; i + 8 <= i1; i += 8) {
      const __m256 wi = _mm256_loadu_ps(w + i), vi = _mm256_loadu_ps(vn + i);
      const __m256 t = _mm256_and_ps(_mm256_cmp_ps(wi, th, _CMP_LT_OQ), _mm256_mul_ps(wi, vi));
      acc = _mm256_fmadd_ps(t, vi, acc);
    }
    s += HSumD(acc);
    for (; i < i1; ++i)
      if (w[i] < theta) s += double(w[i]) * vn[i] * vn[i];
  }
  return s;
}

uint32_t Select(const float* w, const float* r, uint32_t n, float tau, uint32_t* idx) {
  const __m256 t = _mm256_set1_ps(tau);
  uint32_t m = 0, i = 0;
  for (; i + 8 <= n; i += 8) {
    unsigned mask = static_cast<unsigned>(_mm256_movemask_ps(
        _mm256_cmp_ps(_mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(r + i)), t, _CMP_GE_OQ)));
    while (mask) {
      idx[m++] = i + static_cast<uint32_t>(__builtin_ctz(mask));
      mask &= mask - 1;
    }
  }
  for (; i < n; ++i)
    if (w[i] * r[i] >= tau) idx[m++] = i;
  return m;
}

void Gather(const uint32_t* idx, const float* coef, uint32_t m, const uint16_t* v, int d, float* acc) {
  int j0 = 0;
  for (; j0 + 64 <= d; j0 += 64) {  // 8 accumulators in registers per 64 channels
    __m256 a[8];
    for (int b = 0; b < 8; ++b) a[b] = _mm256_loadu_ps(acc + j0 + 8 * b);
    for (uint32_t s = 0; s < m; ++s) {
      const uint16_t* row = v + size_t{idx[s]} * d + j0;
      const __m256 c = _mm256_set1_ps(coef[s]);
      for (int b = 0; b < 8; ++b) a[b] = _mm256_fmadd_ps(c, Load8(row + 8 * b), a[b]);
    }
    for (int b = 0; b < 8; ++b) _mm256_storeu_ps(acc + j0 + 8 * b, a[b]);
  }
  for (uint32_t s = 0; s < m && j0 < d; ++s) {
    const uint16_t* row = v + size_t{idx[s]} * d;
    for (int j = j0; j < d; ++j) acc[j] += coef[s] * HalfToFloat(row[j]);
  }
}

}  // namespace

const DecodeKernels& Avx2Kernels() {
  static const DecodeKernels k{Scores, ExpShift, Accumulate, DotRow, RaceRates, WeightSums, MaskedWvv, Select, Gather};
  return k;
}

}  // namespace flatkv::attention
