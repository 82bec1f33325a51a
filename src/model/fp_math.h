// The transformer's fixed-order float kernels (dot product, sum, exp,
// weighted row sum), shared with attention/ so that attention over a
// compacted KV reduces in exactly the reference order and, with nothing
// removed, gives bit-identical results (model/transformer.h explains the
// determinism rule). Every multiply and add is rounded on its own: the build
// passes -ffp-contract=off.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>

#if defined(__clang__)
#pragma clang fp contract(off)
#endif

namespace flatkv::model::fp {

constexpr int kLanes = 8;  // partial sums per dot product; the trees below assume 8
static_assert(kLanes == 8);

// in: a (len), b (len); out: sum_j a[j] * b[j], as kLanes partial sums
// (lane l takes j = l mod kLanes, in increasing j) added in a fixed tree.
// Written so the compiler can keep the lanes in SIMD registers; the result
// depends on a, b and len only.
inline float Dot(const float* a, const float* b, int len) {
  float acc[kLanes] = {};
  int j = 0;
  for (; j + kLanes <= len; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += a[j + l] * b[j + l];
  }
  for (int l = 0; j < len; ++j, ++l) acc[l] += a[j] * b[j];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// in: a (len); out: sum_j a[j], as kLanes partial sums like Dot.
inline float Sum(const float* a, int len) {
  float acc[kLanes] = {};
  int j = 0;
  for (; j + kLanes <= len; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += a[j + l];
  }
  for (int l = 0; j < len; ++j, ++l) acc[l] += a[j];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// c ? a : b without a branch, so that loops using it still vectorise
// (GCC does not if-convert float compares under its default trapping math).
inline float Select(bool c, float a, float b) {
  const uint32_t m = 0u - static_cast<uint32_t>(c);
  return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & m) | (std::bit_cast<uint32_t>(b) & ~m));
}

// exp(x) in float, within 1 ulp for x in [-87, 88]; 0 below, exp(88) above,
// NaN for NaN. Our own (Cephes' expf polynomial) rather than libm's: loops
// over it vectorise, and it gives the same bits on every x86 CPU, where
// libm picks an FMA or a plain variant at run time.
inline float Exp(float x) {
  const bool underflow = x < -87.0f;
  x = Select(x > 88.0f, 88.0f, Select(underflow, -87.0f, x));
  // n = round(x / ln 2) by the 1.5 * 2^23 trick; t's low mantissa bits hold n.
  constexpr float kShift = 12582912.0f;
  const float t = x * 1.44269504088896341f + kShift;
  const float n = t - kShift;
  float r = x - n * 0.693359375f;  // ln 2 in two parts
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n built from n's bits in t (uint32 arithmetic: wraps, never UB).
  const uint32_t e = (std::bit_cast<uint32_t>(t) - std::bit_cast<uint32_t>(kShift) + 127u) << 23;
  return Select(underflow, 0.0f, p * std::bit_cast<float>(e));
}

// in: w (len), rows r_s = rows + s * stride of width m <= kLanes;
// in/out: acc (m) += w[s] * r_s for s = 0..len-1 in order.
inline void WeightedSum(const float* w, const float* rows, int stride, int len, int m, float* acc) {
  if (m == kLanes) {  // the common case, with the lanes in registers
    float a[kLanes];
    std::copy(acc, acc + kLanes, a);
    for (int s = 0; s < len; ++s) {
      const float* r = rows + static_cast<size_t>(s) * stride;
      for (int i = 0; i < kLanes; ++i) a[i] += w[s] * r[i];
    }
    std::copy(a, a + kLanes, acc);
    return;
  }
  for (int s = 0; s < len; ++s) {
    const float* r = rows + static_cast<size_t>(s) * stride;
    for (int i = 0; i < m; ++i) acc[i] += w[s] * r[i];
  }
}

}  // namespace flatkv::model::fp
