// AVX2 versions of codec/kernels.h; bit-identical to the scalar reference.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "codec/dtype.h"
#include "codec/kernels.h"

namespace flatkv::codec {
namespace scalar {
extern const Kernels kKernels;
}
namespace avx2 {
namespace {

// One 8-wide vector through the in-register stages h = 1, 2, 4.
inline __m256 Fwht8(__m256 v) {
  __m256 s = _mm256_permute_ps(v, 0xB1);
  v = _mm256_blend_ps(_mm256_add_ps(v, s), _mm256_sub_ps(s, v), 0xAA);
  s = _mm256_permute_ps(v, 0x4E);
  v = _mm256_blend_ps(_mm256_add_ps(v, s), _mm256_sub_ps(s, v), 0xCC);
  s = _mm256_permute2f128_ps(v, v, 1);
  return _mm256_blend_ps(_mm256_add_ps(v, s), _mm256_sub_ps(s, v), 0xF0);
}

// One cross-vector stage (distance H vectors) over NV vectors.
template <int NV, int H>
inline void Stage(__m256* r) {
  if constexpr (H < NV) {
#pragma GCC unroll 16
    for (int i = 0; i < NV; i += 2 * H)
#pragma GCC unroll 16
      for (int j = i; j < i + H; ++j) {
        const __m256 a = r[j], c = r[j + H];
        r[j] = _mm256_add_ps(a, c);
        r[j + H] = _mm256_sub_ps(a, c);
      }
    Stage<NV, 2 * H>(r);
  }
}

// A block of NV vectors (8 * NV floats) transformed in registers.
template <int NV>
inline void FwhtRegs(float* v) {
  __m256 r[NV];
#pragma GCC unroll 16
  for (int i = 0; i < NV; ++i) r[i] = Fwht8(_mm256_loadu_ps(v + 8 * i));
  Stage<NV, 1>(r);
#pragma GCC unroll 16
  for (int i = 0; i < NV; ++i) _mm256_storeu_ps(v + 8 * i, r[i]);
}

void FwhtBlocks(float* x, size_t n, size_t block) {
  switch (block) {
    case 8:
      for (size_t b = 0; b < n; b += 8) FwhtRegs<1>(x + b);
      return;
    case 16:
      for (size_t b = 0; b < n; b += 16) FwhtRegs<2>(x + b);
      return;
    case 32:
      for (size_t b = 0; b < n; b += 32) FwhtRegs<4>(x + b);
      return;
    case 64:
      for (size_t b = 0; b < n; b += 64) FwhtRegs<8>(x + b);
      return;
    case 128:
      for (size_t b = 0; b < n; b += 128) FwhtRegs<16>(x + b);
      return;
    default:
      break;
  }
  for (size_t b = 0; b < n; b += block) {
    float* v = x + b;
    for (size_t i = 0; i < block; i += 8) _mm256_storeu_ps(v + i, Fwht8(_mm256_loadu_ps(v + i)));
    for (size_t h = 8; h < block; h *= 2)
      for (size_t i = 0; i < block; i += 2 * h)
        for (size_t j = i; j < i + h; j += 8) {
          const __m256 a = _mm256_loadu_ps(v + j), c = _mm256_loadu_ps(v + j + h);
          _mm256_storeu_ps(v + j, _mm256_add_ps(a, c));
          _mm256_storeu_ps(v + j + h, _mm256_sub_ps(a, c));
        }
  }
}

void SignFwht(float* x, const float* sign, size_t n, size_t block, float scale) {
  if (block < 8) return scalar::kKernels.sign_fwht(x, sign, n, block, scale);
  for (size_t i = 0; i < n; i += 8)
    _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(sign + i)));
  FwhtBlocks(x, n, block);
  const __m256 s = _mm256_set1_ps(scale);
  for (size_t i = 0; i < n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), s));
}

void FwhtSign(float* x, const float* sign, size_t n, size_t block, float scale) {
  if (block < 8) return scalar::kKernels.fwht_sign(x, sign, n, block, scale);
  FwhtBlocks(x, n, block);
  const __m256 s = _mm256_set1_ps(scale);
  for (size_t i = 0; i < n; i += 8)
    _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(sign + i)), s));
}

// Eight codes starting at code index i (i * bits a multiple of 8).
inline __m256 Codes8(const uint8_t* packed, int bits, size_t i) {
  const uint8_t* p = packed + i * size_t(bits) / 8;
  if (bits == 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(w))));
  }
  uint32_t w = 0;
  std::memcpy(&w, p, size_t(bits));
  const __m256i shifts =
      bits == 4 ? _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28) : _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  const __m256i v =
      _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int(w)), shifts), _mm256_set1_epi32((1 << bits) - 1));
  return _mm256_cvtepi32_ps(v);
}

void DequantScalar(const uint8_t* packed, int bits, size_t first, size_t n, float lo, float step, float* out) {
  size_t i = 0;
  if ((bits == 2 || bits == 4 || bits == 8) && (first * size_t(bits)) % 8 == 0) {
    const __m256 l = _mm256_set1_ps(lo), s = _mm256_set1_ps(step);
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(out + i, _mm256_add_ps(l, _mm256_mul_ps(s, Codes8(packed, bits, first + i))));
  }
  if (i < n) scalar::kKernels.dequant_scalar(packed, bits, first + i, n - i, lo, step, out + i);
}

void DequantVec(const uint8_t* packed, int bits, size_t first, size_t n, const float* lo, const float* step,
                float* out) {
  size_t i = 0;
  if ((bits == 2 || bits == 4 || bits == 8) && (first * size_t(bits)) % 8 == 0)
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(lo + i), _mm256_mul_ps(_mm256_loadu_ps(step + i),
                                                                                     Codes8(packed, bits, first + i))));
  if (i < n) scalar::kKernels.dequant_vec(packed, bits, first + i, n - i, lo + i, step + i, out + i);
}

void RopePredict(const float* prev, const float* cs, const float* sn, float* out, size_t n) {
  size_t c = 0;
  for (; c + 8 <= n; c += 8) {
    const __m256 a = _mm256_loadu_ps(prev + c);
    const __m256 b = _mm256_permute_ps(a, 0xB1);  // prev[c ^ 1]
    const __m256 p =
        _mm256_add_ps(_mm256_mul_ps(a, _mm256_loadu_ps(cs + c)), _mm256_mul_ps(b, _mm256_loadu_ps(sn + c)));
    _mm256_storeu_ps(out + c, _mm256_and_ps(p, _mm256_cmp_ps(p, p, _CMP_ORD_Q)));
  }
  if (c < n) scalar::kKernels.rope_predict(prev + c, cs + c, sn + c, out + c, n - c);
}

// Rounds 8 floats (no NaNs) to bf16 and back, as FloatToBf16 does.
inline __m256 RoundBf16(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i r = _mm256_add_epi32(
      u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))));
  return _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32(int(0xFFFF0000u))));
}

size_t PredReconstruct(const uint8_t* tok, const float* pred, float* out, size_t n, float step, int dtype) {
  const DType dt = DType(dtype);
  const __m256i one = _mm256_set1_epi32(1), ff = _mm256_set1_epi32(255), zero = _mm256_setzero_si256();
  const __m256 st = _mm256_set1_ps(step);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, tok + i, 8);
    const __m256i b = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(w)));
    const __m256i escape = _mm256_or_si256(_mm256_cmpeq_epi32(b, zero), _mm256_cmpeq_epi32(b, ff));
    const __m256i z = _mm256_sub_epi32(b, one);
    const __m256i q = _mm256_xor_si256(_mm256_srli_epi32(z, 1), _mm256_sub_epi32(zero, _mm256_and_si256(z, one)));
    const __m256 r = _mm256_add_ps(_mm256_loadu_ps(pred + i), _mm256_mul_ps(_mm256_cvtepi32_ps(q), st));
    __m256 o = r;
    if (dt == DType::kBF16)
      o = RoundBf16(r);
    else if (dt == DType::kF16)
      o = _mm256_cvtph_ps(_mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    _mm256_storeu_ps(out + i, o);
    // An escape token or a NaN: the lanes before it are done; the caller
    // takes that element (and rewrites the lanes after it).
    const uint32_t stop = uint32_t(_mm256_movemask_ps(_mm256_castsi256_ps(escape))) |
                          uint32_t(_mm256_movemask_ps(_mm256_cmp_ps(r, r, _CMP_UNORD_Q)));
    if (stop) return i + size_t(__builtin_ctz(stop));
  }
  return i + scalar::kKernels.pred_reconstruct(tok + i, pred + i, out + i, std::min<size_t>(n - i, 8), step, dtype);
}

}  // namespace

extern const Kernels kKernels;
const Kernels kKernels = {&SignFwht, &FwhtSign, &DequantScalar, &DequantVec, &RopePredict, &PredReconstruct};

}  // namespace avx2
}  // namespace flatkv::codec
