#include "codec/dtype.h"

namespace flatkv::codec {
namespace scalar {

void ToFloat(DType dtype, const std::byte* in, float* out, size_t n) {
  if (n == 0) return;
  if (dtype == DType::kF32) {
    std::memcpy(out, in, 4 * n);
    return;
  }
  for (size_t i = 0; i < n; ++i) out[i] = LoadElement(dtype, in, i);
}

void FromFloat(DType dtype, const float* in, std::byte* out, size_t n) {
  if (n == 0) return;
  switch (dtype) {
    case DType::kF32:
      std::memcpy(out, in, 4 * n);
      return;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = FloatToHalf(in[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = FloatToBf16(in[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case DType::kF8E4M3:  // bytes to the codecs: their Supports() refuses fp8
    case DType::kF8E5M2:
      return;
  }
}

}  // namespace scalar

void ToFloat(DType dtype, const std::byte* in, float* out, size_t n) {
  if (DetectedSimd() >= SimdLevel::kAvx2) return avx2::ToFloat(dtype, in, out, n);
  scalar::ToFloat(dtype, in, out, n);
}

void FromFloat(DType dtype, const float* in, std::byte* out, size_t n) {
  if (DetectedSimd() >= SimdLevel::kAvx2) return avx2::FromFloat(dtype, in, out, n);
  scalar::FromFloat(dtype, in, out, n);
}

}  // namespace flatkv::codec
