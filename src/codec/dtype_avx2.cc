// AVX2 + F16C element conversions; bit-identical to the scalar ones.
#include <immintrin.h>

#include "codec/dtype.h"

namespace flatkv::codec::avx2 {

void ToFloat(DType dtype, const std::byte* in, float* out, size_t n) {
  size_t i = 0;
  if (dtype == DType::kF16) {
    // F16C quiets signalling NaNs; chunks holding a NaN go the scalar way.
    const __m128i abs = _mm_set1_epi16(0x7FFF), inf = _mm_set1_epi16(0x7C00);
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i));
      if (_mm_movemask_epi8(_mm_cmpgt_epi16(_mm_and_si128(h, abs), inf)))
        scalar::ToFloat(dtype, in + 2 * i, out + i, 8);
      else
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
    }
  } else if (dtype == DType::kBF16) {
    for (; i + 8 <= n; i += 8) {
      const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i)));
      _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
  }
  scalar::ToFloat(dtype, in + i * DTypeBytes(dtype), out + i, n - i);
}

void FromFloat(DType dtype, const float* in, std::byte* out, size_t n) {
  size_t i = 0;
  if (dtype == DType::kF16) {
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_loadu_ps(in + i);
      if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)))
        scalar::FromFloat(dtype, in + i, out + 2 * i, 8);
      else
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i),
                         _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
  } else if (dtype == DType::kBF16) {
    const __m256i bias = _mm256_set1_epi32(0x7FFF), one = _mm256_set1_epi32(1);
    const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F800000);
    for (; i + 8 <= n; i += 8) {
      const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(in + i));
      const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
      const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
      // NaN: keep the top payload bits, forcing a quiet bit only when they are all zero.
      const __m256i top = _mm256_and_si256(u, _mm256_set1_epi32(0x007F0000));
      const __m256i zero_top = _mm256_cmpeq_epi32(top, _mm256_setzero_si256());
      const __m256i q = _mm256_or_si256(u, _mm256_and_si256(zero_top, _mm256_set1_epi32(0x400000)));
      const __m256i sel = _mm256_srli_epi32(_mm256_blendv_epi8(r, q, nan), 16);
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(sel, sel), 0x08);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), _mm256_castsi256_si128(packed));
    }
  }
  scalar::FromFloat(dtype, in + i, out + i * DTypeBytes(dtype), n - i);
}

}  // namespace flatkv::codec::avx2
