// AVX2 + FMA + F16C versions of the decode kernels (decode_kernels.h).
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>

#include "attention/decode_kernels.h"
#include "attention/f16.h"

namespace flatkv::attention {
namespace {

inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256 Load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// exp(x) for x <= 0 (Cephes' polynomial, as model/fp_math.h), 0 below -87.
inline __m256 Exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)), lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

float DotRow(const float* q, const uint16_t* row, int d) {
  __m256 acc = _mm256_setzero_ps();
  int j = 0;
  for (; j + 8 <= d; j += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + j), Load8(row + j), acc);
  float s = HSum(acc);
  for (; j < d; ++j) s += q[j] * HalfToFloat(row[j]);
  return s;
}

void Scores(const float* q, int g, const uint16_t* k, uint32_t n, int d, float scale, float* s) {
  const int d8 = d & ~7;
  for (uint32_t t = 0; t < n; ++t) {
    const uint16_t* row = k + size_t{t} * d;
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

void Accumulate(const float* p, uint32_t p_stride, int g, const uint16_t* v, uint32_t n, int d, float* acc) {
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


void SamplerPass(const float* w, const float* r, const float* vn, uint32_t n, uint8_t* lev, double* z, double* wv,
                 double* buckets) {
  float zs = 0, ws = 0;
  for (uint32_t i = 0; i < n; ++i) {
    zs += w[i];
    ws += w[i] * vn[i];
    const int e = static_cast<int>(std::bit_cast<uint32_t>(w[i] * r[i]) >> 23);  // biased exponent (x >= 0)
    lev[i] = static_cast<uint8_t>(std::clamp(127 - e, 0, 255));
  }
  *z += zs;
  *wv += ws;
  // Four interleaved copies break the dependency on a popular bucket.
  double b4[4][256] = {};
  uint32_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int c = 0; c < 4; ++c) b4[c][std::bit_cast<uint32_t>(w[i + c]) >> 22] += double(w[i + c]) * vn[i + c] * vn[i + c];
  for (; i < n; ++i) b4[0][std::bit_cast<uint32_t>(w[i]) >> 22] += double(w[i]) * vn[i] * vn[i];
  for (int b = 0; b < 256; ++b) buckets[b] += (b4[0][b] + b4[1][b]) + (b4[2][b] + b4[3][b]);
}

}  // namespace

const DecodeKernels& Avx2Kernels() {
  static const DecodeKernels k{Scores, ExpShift, Accumulate, DotRow, SamplerPass};
  return k;
}

}  // namespace flatkv::attention
