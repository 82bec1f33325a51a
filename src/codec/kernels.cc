#include "codec/kernels.h"

#include <cstring>

#include "codec/dtype.h"
#include "common/cpu.h"

namespace flatkv::codec {
namespace scalar {
namespace {

void Fwht(float* x, size_t n, size_t block) {
  for (size_t b = 0; b < n; b += block) {
    float* v = x + b;
    for (size_t h = 1; h < block; h *= 2)
      for (size_t i = 0; i < block; i += 2 * h)
        for (size_t j = i; j < i + h; ++j) {
          const float a = v[j], c = v[j + h];
          v[j] = a + c;
          v[j + h] = a - c;
        }
  }
}

void SignFwht(float* x, const float* sign, size_t n, size_t block, float scale) {
  for (size_t i = 0; i < n; ++i) x[i] *= sign[i];
  Fwht(x, n, block);
  for (size_t i = 0; i < n; ++i) x[i] *= scale;
}

void FwhtSign(float* x, const float* sign, size_t n, size_t block, float scale) {
  Fwht(x, n, block);
  for (size_t i = 0; i < n; ++i) x[i] = x[i] * sign[i] * scale;
}

inline uint32_t Code(const uint8_t* packed, int bits, size_t i) {
  const size_t bit = i * size_t(bits);
  uint32_t v = packed[bit >> 3] >> (bit & 7);
  if ((bit & 7) + size_t(bits) > 8) v |= uint32_t(packed[(bit >> 3) + 1]) << (8 - (bit & 7));
  return v & ((1u << bits) - 1);
}

void DequantScalar(const uint8_t* packed, int bits, size_t first, size_t n, float lo, float step, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = lo + step * float(Code(packed, bits, first + i));
}

void DequantVec(const uint8_t* packed, int bits, size_t first, size_t n, const float* lo, const float* step,
                float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = lo[i] + step[i] * float(Code(packed, bits, first + i));
}

void RopePredict(const float* prev, const float* cs, const float* sn, float* out, size_t n) {
  for (size_t c = 0; c < n; ++c) {
    const float p = prev[c] * cs[c] + prev[c ^ 1] * sn[c];
    out[c] = p == p ? p : 0.0f;
  }
}

size_t PredReconstruct(const uint8_t* tok, const float* pred, float* out, size_t n, float step, int dtype) {
  const DType dt = DType(dtype);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t b = tok[i];
    if (b == 0 || b == 255) return i;
    const uint32_t z = b - 1;
    const int32_t q = int32_t((z >> 1) ^ (0u - (z & 1)));
    out[i] = RoundToDType(dt, pred[i] + float(q) * step);
  }
  return n;
}

}  // namespace

extern const Kernels kKernels;
const Kernels kKernels = {&SignFwht, &FwhtSign, &DequantScalar, &DequantVec, &RopePredict, &PredReconstruct};

}  // namespace scalar

namespace avx2 {
extern const Kernels kKernels;
}

const Kernels& ScalarKernels() { return scalar::kKernels; }
const Kernels* Avx2Kernels() { return DetectedSimd() >= SimdLevel::kAvx2 ? &avx2::kKernels : nullptr; }
const Kernels& ActiveKernels() {
  static const Kernels* k = Avx2Kernels() ? Avx2Kernels() : &ScalarKernels();
  return *k;
}

void PackCodes(const uint8_t* codes, size_t n, int bits, uint8_t* out) {
  std::memset(out, 0, (n * size_t(bits) + 7) / 8);
  for (size_t i = 0; i < n; ++i) {
    const size_t bit = i * size_t(bits);
    const uint32_t v = uint32_t(codes[i]) << (bit & 7);
    out[bit >> 3] |= uint8_t(v);
    if ((bit & 7) + size_t(bits) > 8) out[(bit >> 3) + 1] |= uint8_t(v >> 8);
  }
}

void UnpackCodes(const uint8_t* packed, int bits, size_t first, size_t n, uint8_t* out) {
  const uint32_t mask = (1u << bits) - 1;
  for (size_t i = 0; i < n; ++i) {
    const size_t bit = (first + i) * size_t(bits);
    uint32_t v = packed[bit >> 3] >> (bit & 7);
    if ((bit & 7) + size_t(bits) > 8) v |= uint32_t(packed[(bit >> 3) + 1]) << (8 - (bit & 7));
    out[i] = uint8_t(v & mask);
  }
}

}  // namespace flatkv::codec
