// AVX2 kernels (kernels.h), bit-identical to the scalar ones: fp::Dot's
// eight lanes are one ymm register, each term is a separate multiply and
// add (no FMA, as -ffp-contract=off keeps the scalar code), and the lanes
// are reduced in fp::Dot's tree ((l0+l4)+(l1+l5))+((l2+l6)+(l3+l7)).
// A tail of len % 8 terms uses masked loads of both operands: the masked
// lanes add 0 * 0 = +0 to an accumulator that is never -0 (it starts at +0,
// and x + y is -0 only when both are -0), so they leave it unchanged.
#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "model/fp_math.h"
#include "model/kernels.h"

namespace flatkv::model {
namespace {

inline __m256i TailMask(int rem) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(rem), idx);
}

// fp::Dot's tree of one accumulator's eight lanes.
inline float Tree(__m256 a) {
  const __m128 c = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));  // l + (l + 4)
  const __m128 d = _mm_add_ps(c, _mm_shuffle_ps(c, c, _MM_SHUFFLE(2, 3, 0, 1)));        // c0+c1, c2+c3 at 0, 2
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehl_ps(d, d)));
}

// fp::Dot's tree of eight accumulators at once: out[j] = Tree(a[j]).
inline __m256 Tree8(const __m256* a) {
  __m256 s[4];
  _Pragma("GCC unroll 16") for (int j = 0; j < 4; ++j)  // keys 2j, 2j+1: [c(2j) | c(2j+1)], c_l = a_l + a_{l+4}
    s[j] = _mm256_add_ps(_mm256_permute2f128_ps(a[2 * j], a[2 * j + 1], 0x20),
                         _mm256_permute2f128_ps(a[2 * j], a[2 * j + 1], 0x31));
  // hadd: [d0 d1 of keys 0, 2 | keys 1, 3] with d0 = c0 + c1, d1 = c2 + c3.
  const __m256 h1 = _mm256_hadd_ps(s[0], s[1]), h2 = _mm256_hadd_ps(s[2], s[3]);
  const __m256 r = _mm256_hadd_ps(h1, h2);  // d0 + d1 of keys [0 2 4 6 | 1 3 5 7]
  return _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// P tokens x R rows of outputs, one ymm accumulator each.
template <int P, int R>
void MatMulTile(const float* x, const float* w, int in, int out, int t0, int i0, float* y) {
  __m256 acc[P][R];
  _Pragma("GCC unroll 16") for (int p = 0; p < P; ++p)
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) acc[p][r] = _mm256_setzero_ps();
  const float* xs[P];
  const float* ws[R];
  _Pragma("GCC unroll 16") for (int p = 0; p < P; ++p) xs[p] = x + static_cast<size_t>(t0 + p) * in;
  _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) ws[r] = w + static_cast<size_t>(i0 + r) * in;
  int j = 0;
  for (; j + 8 <= in; j += 8) {
    __m256 wv[R];
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) wv[r] = _mm256_loadu_ps(ws[r] + j);
    _Pragma("GCC unroll 16") for (int p = 0; p < P; ++p) {
      const __m256 xv = _mm256_loadu_ps(xs[p] + j);
      _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) acc[p][r] = _mm256_add_ps(acc[p][r], _mm256_mul_ps(xv, wv[r]));
    }
  }
  if (j < in) {
    const __m256i m = TailMask(in - j);
    __m256 wv[R];
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) wv[r] = _mm256_maskload_ps(ws[r] + j, m);
    _Pragma("GCC unroll 16") for (int p = 0; p < P; ++p) {
      const __m256 xv = _mm256_maskload_ps(xs[p] + j, m);
      _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) acc[p][r] = _mm256_add_ps(acc[p][r], _mm256_mul_ps(xv, wv[r]));
    }
  }
  _Pragma("GCC unroll 16") for (int p = 0; p < P; ++p)
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) y[static_cast<size_t>(t0 + p) * out + i0 + r] = Tree(acc[p][r]);
}

template <int P>
void MatMulRowsP(const float* x, const float* w, int in, int out, int t0, int r0, int r1, float* y) {
  constexpr int R = 3;
  int i = r0;
  for (; i + R <= r1; i += R) MatMulTile<P, R>(x, w, in, out, t0, i, y);
  if (r1 - i == 2) MatMulTile<P, 2>(x, w, in, out, t0, i, y);
  if (r1 - i == 1) MatMulTile<P, 1>(x, w, in, out, t0, i, y);
}

void MatMulRowsAvx2(const float* x, const float* w, int n, int in, int out, int r0, int r1, float* y) {
  // Token tiles of 4 outer (x rows stay in L1), row blocks of 3 inner.
  int t = 0;
  for (; t + 4 <= n; t += 4) MatMulRowsP<4>(x, w, in, out, t, r0, r1, y);
  if (n - t == 3) MatMulRowsP<3>(x, w, in, out, t, r0, r1, y);
  if (n - t == 2) MatMulRowsP<2>(x, w, in, out, t, r0, r1, y);
  if (n - t == 1) MatMulRowsP<1>(x, w, in, out, t, r0, r1, y);
}

// Scores of query qh against keys rows k_s = kb + s * kv_dim, s in [0, len):
// att[s] = fp::Dot(qh, k_s, hs) / sqrt_hs; returns max(m, att[s]...) taken
// as std::max (the scalar loop's value: the sign of a zero maximum may
// differ, which Exp(att - max) does not see).
inline __m256 Scores(const float* qh, const float* kb, int kv_dim, int hs, uint32_t len, float sqrt_hs, float* att,
                     __m256 vmax) {
  const __m256 div = _mm256_set1_ps(sqrt_hs);
  const int full = hs / 8 * 8;
  const __m256i m = TailMask(hs - full);
  uint32_t s = 0;
  for (; s + 8 <= len; s += 8) {
    __m256 acc[8];
    _Pragma("GCC unroll 16") for (int k = 0; k < 8; ++k) acc[k] = _mm256_setzero_ps();
    for (int j = 0; j < full; j += 8) {
      const __m256 qv = _mm256_loadu_ps(qh + j);
      _Pragma("GCC unroll 16") for (int k = 0; k < 8; ++k)
        acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(qv, _mm256_loadu_ps(kb + static_cast<size_t>(s + k) * kv_dim + j)));
    }
    if (full < hs) {
      const __m256 qv = _mm256_maskload_ps(qh + full, m);
      _Pragma("GCC unroll 16") for (int k = 0; k < 8; ++k)
        acc[k] = _mm256_add_ps(
            acc[k], _mm256_mul_ps(qv, _mm256_maskload_ps(kb + static_cast<size_t>(s + k) * kv_dim + full, m)));
    }
    const __m256 sc = _mm256_div_ps(Tree8(acc), div);
    _mm256_storeu_ps(att + s, sc);
    vmax = _mm256_max_ps(sc, vmax);  // (vmax < sc) ? sc : vmax, as std::max(vmax, sc)
  }
  float mx = -INFINITY;
  for (; s < len; ++s) {
    att[s] = fp::Dot(qh, kb + static_cast<size_t>(s) * kv_dim, hs) / sqrt_hs;
    mx = std::max(mx, att[s]);
  }
  return _mm256_max_ps(_mm256_set1_ps(mx), vmax);
}

// acc (hs) += sum over s in [0, len) in order of w[s] * v_s, v_s = vb + s * kv_dim.
template <int B>
inline void WeightedRows(const float* w, const float* vb, int kv_dim, uint32_t len, float* acc) {
  __m256 a[B];
  _Pragma("GCC unroll 16") for (int b = 0; b < B; ++b) a[b] = _mm256_loadu_ps(acc + 8 * b);
  for (uint32_t s = 0; s < len; ++s) {
    const __m256 ws = _mm256_set1_ps(w[s]);
    const float* v = vb + static_cast<size_t>(s) * kv_dim;
    _Pragma("GCC unroll 16") for (int b = 0; b < B; ++b) a[b] = _mm256_add_ps(a[b], _mm256_mul_ps(ws, _mm256_loadu_ps(v + 8 * b)));
  }
  _Pragma("GCC unroll 16") for (int b = 0; b < B; ++b) _mm256_storeu_ps(acc + 8 * b, a[b]);
}

void WeightedBlock(const float* w, const float* vb, int kv_dim, uint32_t len, int hs, float* acc) {
  int i = 0;
  for (; i + 64 <= hs; i += 64) WeightedRows<8>(w, vb + i, kv_dim, len, acc + i);
  switch ((hs - i) / 8) {
    case 7: WeightedRows<7>(w, vb + i, kv_dim, len, acc + i); break;
    case 6: WeightedRows<6>(w, vb + i, kv_dim, len, acc + i); break;
    case 5: WeightedRows<5>(w, vb + i, kv_dim, len, acc + i); break;
    case 4: WeightedRows<4>(w, vb + i, kv_dim, len, acc + i); break;
    case 3: WeightedRows<3>(w, vb + i, kv_dim, len, acc + i); break;
    case 2: WeightedRows<2>(w, vb + i, kv_dim, len, acc + i); break;
    case 1: WeightedRows<1>(w, vb + i, kv_dim, len, acc + i); break;
    default: break;
  }
  i += (hs - i) / 8 * 8;
  if (i < hs) fp::WeightedSum(w, vb + i, kv_dim, static_cast<int>(len), hs - i, acc + i);
}

// Key block by key block (the cache's pages), every query of the block
// over it while its K (then V) rows are in L1; each query's scores, softmax
// and weighted sum are its own, in the reference order.
void AttendAvx2(const float* q, int q_stride, const uint32_t* pos, int nt, int group, int hs, const KvCache& cache,
                int layer, int kv_off, float sqrt_hs, float* att, float* o) {
  const int kv_dim = cache.kv_dim();
  const uint32_t bt = cache.block_tokens();
  const uint32_t pmax = pos[nt - 1];
  const size_t arow = size_t{pmax} + 1;
  const int nq = nt * group;
  constexpr int kMaxQueries = 64;
  __m256 vmax[kMaxQueries];
  for (int qi0 = 0; qi0 < nq; qi0 += kMaxQueries) {  // bounds vmax; one pass in the transformer's use
    const int qi1 = std::min(nq, qi0 + kMaxQueries);
    for (int qi = qi0; qi < qi1; ++qi) vmax[qi - qi0] = _mm256_set1_ps(-INFINITY);
    for (uint32_t s0 = 0; s0 <= pmax; s0 += bt) {
      const float* kb = cache.k(layer, s0) + kv_off;
      for (int qi = qi0; qi < qi1; ++qi) {
        const int t = qi / group, g = qi % group;
        if (pos[t] < s0) continue;
        const uint32_t len = std::min(pos[t] + 1, s0 + bt) - s0;
        const float* qh = q + static_cast<size_t>(t) * q_stride + static_cast<size_t>(g) * hs;
        vmax[qi - qi0] = Scores(qh, kb, kv_dim, hs, len, sqrt_hs, att + qi * arow + s0, vmax[qi - qi0]);
      }
    }
    for (int qi = qi0; qi < qi1; ++qi) {
      const int t = qi / group, g = qi % group;
      float* a = att + qi * arow;
      const int len = static_cast<int>(pos[t]) + 1;
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, vmax[qi - qi0]);
      float max = lanes[0];
      for (int l = 1; l < 8; ++l) max = std::max(max, lanes[l]);
      for (int s = 0; s < len; ++s) a[s] = fp::Exp(a[s] - max);  // vectorised by the compiler
      const float sum = fp::Sum(a, len);
      for (int s = 0; s < len; ++s) a[s] /= sum;
      float* oh = o + static_cast<size_t>(t) * q_stride + static_cast<size_t>(g) * hs;
      std::fill(oh, oh + hs, 0.0f);
    }
    for (uint32_t s0 = 0; s0 <= pmax; s0 += bt) {
      const float* vb = cache.v(layer, s0) + kv_off;
      for (int qi = qi0; qi < qi1; ++qi) {
        const int t = qi / group, g = qi % group;
        if (pos[t] < s0) continue;
        const uint32_t len = std::min(pos[t] + 1, s0 + bt) - s0;
        float* oh = o + static_cast<size_t>(t) * q_stride + static_cast<size_t>(g) * hs;
        WeightedBlock(att + qi * arow + s0, vb, kv_dim, len, hs, oh);
      }
    }
  }
}

}  // namespace

namespace internal {
const Kernels* Avx2Kernels() {
  static const Kernels k{SimdLevel::kAvx2, MatMulRowsAvx2, AttendAvx2};
  return &k;
}
}  // namespace internal

}  // namespace flatkv::model
#endif  // __x86_64__
