// AVX-512 matmul (kernels.h), bit-identical to the scalar one. A zmm
// register holds fp::Dot's eight lanes for two tokens at once: x is packed
// per pair of tokens, block b of 8 inputs as [x_t[8b..8b+7] | x_t+1[...]]
// (zero past `in`, and for a missing second token), and each weight block
// is broadcast to both halves. Each lane still takes one multiply and one
// add per term (no FMA) and each half is reduced in fp::Dot's tree. The
// tail block's weights are masked to 0 with the packed zeros, so its dead
// lanes add 0 * 0 = +0 to accumulators that are never -0 (kernels_avx2.cc).
// Attention uses the AVX2 kernel.
#if defined(__x86_64__)
// GCC 12's AVX-512 headers build _mm512_undefined_ps from a self-initialised
// variable, which -Wuninitialized reports at every inlined use.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "model/kernels.h"

namespace flatkv::model {
namespace {

// fp::Dot's tree of each 8-lane half: lane 0 and lane 8 of the result.
inline void Tree2(__m512 a, float* lo, float* hi) {
  const __m512 c = _mm512_add_ps(a, _mm512_shuffle_f32x4(a, a, _MM_SHUFFLE(2, 3, 0, 1)));  // l + (l + 4)
  const __m512 d = _mm512_add_ps(c, _mm512_permute_ps(c, _MM_SHUFFLE(2, 3, 0, 1)));       // c0+c1, c2+c3
  const __m512 e = _mm512_add_ps(d, _mm512_permute_ps(d, _MM_SHUFFLE(1, 0, 3, 2)));       // d0 + d1
  *lo = _mm512_cvtss_f32(e);
  *hi = _mm_cvtss_f32(_mm512_extractf32x4_ps(e, 2));
}

// P token pairs x R rows; xp: the first pair's packed blocks, pairs `pstride` floats apart.
template <int P, int R>
void Tile(const float* xp, size_t pstride, const float* w, int in, int out, int n, int t0, int i0, float* y) {
  __m512 acc[P][R];
  _Pragma("GCC unroll 16") for (int p = 0; p < P; ++p)
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) acc[p][r] = _mm512_setzero_ps();
  const float* ws[R];
  _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) ws[r] = w + static_cast<size_t>(i0 + r) * in;
  const int full = in / 8;
  for (int b = 0; b < full; ++b) {
    __m512 wv[R];
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) wv[r] = _mm512_broadcast_f32x8(_mm256_loadu_ps(ws[r] + 8 * b));
    _Pragma("GCC unroll 16") for (int p = 0; p < P; ++p) {
      const __m512 xv = _mm512_loadu_ps(xp + p * pstride + 16 * b);
      _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) acc[p][r] = _mm512_add_ps(acc[p][r], _mm512_mul_ps(xv, wv[r]));
    }
  }
  if (const int rem = in - 8 * full; rem > 0) {
    const __mmask8 m = static_cast<__mmask8>((1u << rem) - 1);
    __m512 wv[R];
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) wv[r] = _mm512_broadcast_f32x8(_mm256_maskz_loadu_ps(m, ws[r] + 8 * full));
    _Pragma("GCC unroll 16") for (int p = 0; p < P; ++p) {
      const __m512 xv = _mm512_loadu_ps(xp + p * pstride + 16 * full);
      _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) acc[p][r] = _mm512_add_ps(acc[p][r], _mm512_mul_ps(xv, wv[r]));
    }
  }
  _Pragma("GCC unroll 16") for (int p = 0; p < P; ++p) {
    const int t = t0 + 2 * p;
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) {
      float lo, hi;
      Tree2(acc[p][r], &lo, &hi);
      y[static_cast<size_t>(t) * out + i0 + r] = lo;
      if (t + 1 < n) y[static_cast<size_t>(t + 1) * out + i0 + r] = hi;
    }
  }
}

template <int P>
void RowsP(const float* xp, size_t pstride, const float* w, int in, int out, int n, int t0, int r0, int r1, float* y) {
  constexpr int R = 6;
  int i = r0;
  for (; i + R <= r1; i += R) Tile<P, R>(xp, pstride, w, in, out, n, t0, i, y);
  switch (r1 - i) {
    case 5: Tile<P, 5>(xp, pstride, w, in, out, n, t0, i, y); break;
    case 4: Tile<P, 4>(xp, pstride, w, in, out, n, t0, i, y); break;
    case 3: Tile<P, 3>(xp, pstride, w, in, out, n, t0, i, y); break;
    case 2: Tile<P, 2>(xp, pstride, w, in, out, n, t0, i, y); break;
    case 1: Tile<P, 1>(xp, pstride, w, in, out, n, t0, i, y); break;
    default: break;
  }
}

// Tokens per pass over this call's weight rows: their packed x (at most
// 64 * 1536 * 4 bytes for SmolLM2's FFN) stays in L2 while the rows stream.
constexpr int kTokenTile = 64;

void MatMulRowsAvx512(const float* x, const float* w, int n, int in, int out, int r0, int r1, float* y) {
  const int blocks = (in + 7) / 8;
  const size_t pstride = static_cast<size_t>(blocks) * 16;
  thread_local std::vector<float> packed;
  for (int t0 = 0; t0 < n; t0 += kTokenTile) {
    const int tn = std::min(kTokenTile, n - t0), pairs = (tn + 1) / 2;
    packed.assign(static_cast<size_t>(pairs) * pstride, 0.0f);
    for (int t = 0; t < tn; ++t) {
      const float* xt = x + static_cast<size_t>(t0 + t) * in;
      float* dst = packed.data() + static_cast<size_t>(t / 2) * pstride + (t % 2) * 8;
      for (int b = 0; b < blocks; ++b) std::copy(xt + 8 * b, xt + std::min(in, 8 * b + 8), dst + 16 * b);
    }
    // Row blocks outer (R rows of weights stay in L1), token pairs inner.
    constexpr int kRowBlock = 6;
    for (int i = r0; i < r1; i += kRowBlock) {
      const int i1 = std::min(r1, i + kRowBlock);
      int p = 0;
      for (; p + 2 <= pairs; p += 2) RowsP<2>(packed.data() + p * pstride, pstride, w, in, out, n, t0 + 2 * p, i, i1, y);
      if (p < pairs) RowsP<1>(packed.data() + p * pstride, pstride, w, in, out, n, t0 + 2 * p, i, i1, y);
    }
  }
}

}  // namespace

namespace internal {
const Kernels* Avx512Kernels() {
  static const Kernels k{SimdLevel::kAvx512, MatMulRowsAvx512, Avx2Kernels()->attend};
  return &k;
}
}  // namespace internal

}  // namespace flatkv::model
#endif  // __x86_64__
