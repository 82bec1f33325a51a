// Element conversions between the slice dtypes (f32, f16, bf16) and f32,
// the working type of every lossy codec. Scalar reference here; the bulk
// converters dispatch to AVX2/F16C (dtype_avx2.cc) at run time.
//
// f32 -> f16/bf16 rounds to nearest even; f16 overflows to infinity. NaNs
// keep their payload's top bits (never quieted), so f16/bf16 -> f32 ->
// f16/bf16 is the identity on every bit pattern. Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/cpu.h"
#include "common/hd.h"
#include "flatkv/shape.h"

namespace flatkv::codec {

// The element conversions are FLATKV_HD: the CUDA decoders
// (gpu/group_dequant.h) convert with these very functions.
FLATKV_HD inline float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
FLATKV_HD inline uint32_t FloatToBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

FLATKV_HD inline float Bf16ToFloat(uint16_t h) { return BitsToFloat(uint32_t(h) << 16); }
FLATKV_HD inline uint16_t FloatToBf16(float f) {
  uint32_t u = FloatToBits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u)  // NaN: keep the payload's top bits, stay a NaN
    return (u & 0x007F0000u) ? uint16_t(u >> 16) : uint16_t((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

FLATKV_HD inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  if (exp == 0x1F) return BitsToFloat(sign | 0x7F800000u | (man << 13));
  if (exp != 0) return BitsToFloat(sign | ((exp + 112) << 23) | (man << 13));
  // Subnormal or zero: man * 2^-24.
  const float v = float(man) * 5.9604644775390625e-08f;
  return sign ? -v : v;
}
FLATKV_HD inline uint16_t FloatToHalf(float f) {
  const uint32_t u = FloatToBits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) {  // NaN: keep the payload's top bits, stay a NaN
    const uint16_t m = uint16_t((a >> 13) & 0x3FF);
    return uint16_t(sign | 0x7C00 | (m ? m : 0x200));
  }
  if (a >= 0x477FF000u) return uint16_t(sign | 0x7C00);  // rounds to >= 65520: inf
  if (a >= 0x38800000u) {                                // normal half
    const uint32_t r = a - 0x38000000u;                  // rebias exponent 127 -> 15
    const uint32_t rounded = r + 0xFFFu + ((r >> 13) & 1);
    return uint16_t(sign | (rounded >> 13));
  }
  // Subnormal half (or zero): value / 2^-24, rounded to nearest even.
  const float scaled = BitsToFloat(a) * 16777216.0f;  // exact (power of two)
  uint32_t m = uint32_t(scaled);
  const float frac = scaled - float(m);
  if (frac > 0.5f || (frac == 0.5f && (m & 1))) ++m;
  return uint16_t(sign | m);
}

// n elements of `dtype` at `in` -> n floats.
void ToFloat(DType dtype, const std::byte* in, float* out, size_t n);
// n floats -> n elements of `dtype` at `out`.
void FromFloat(DType dtype, const float* in, std::byte* out, size_t n);
// One element.
inline float LoadElement(DType dtype, const std::byte* p, size_t i) {
  switch (dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      return f;
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      return HalfToFloat(h);
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      return Bf16ToFloat(h);
    }
    case DType::kF8E4M3:  // bytes to the codecs: their Supports() refuses fp8
    case DType::kF8E5M2:
      break;
  }
  return 0;
}
// Rounds a float to the nearest value representable in `dtype`.
inline float RoundToDType(DType dtype, float f) {
  switch (dtype) {
    case DType::kF16:
      return HalfToFloat(FloatToHalf(f));
    case DType::kBF16:
      return Bf16ToFloat(FloatToBf16(f));
    case DType::kF32:
    case DType::kF8E4M3:  // bytes to the codecs: their Supports() refuses fp8
    case DType::kF8E5M2:
      return f;
  }
  return f;
}

namespace scalar {
void ToFloat(DType dtype, const std::byte* in, float* out, size_t n);
void FromFloat(DType dtype, const float* in, std::byte* out, size_t n);
}  // namespace scalar
namespace avx2 {
void ToFloat(DType dtype, const std::byte* in, float* out, size_t n);
void FromFloat(DType dtype, const float* in, std::byte* out, size_t n);
}  // namespace avx2

}  // namespace flatkv::codec
