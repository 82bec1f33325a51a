// The decode kernels' inner loops over one chunk of f16 K/V rows, for the
// G query heads that share a KV head (GQA). The scalar versions
// (decode_kernels.cc) are the reference; decode_kernels_avx2.cc has the
// F16C/AVX2/FMA ones, chosen at run time (common/cpu.h).
//
//   scores     s[g * n + t] = scale * (q[g * d ..] . k_t)       k_t = k + t * d (f16)
//   exp_shift  x[i] = exp(x[i] - m)                             (in place)
//   accumulate acc[g * d + j] += sum_t p[g * p_stride + t] * v_t[j]
//   dot_row    q . row                                        (one f16 row)
// Results agree with the scalar reference to float rounding (sums are
// reassociated), not bit for bit.
#pragma once

#include <cstdint>

#include "common/cpu.h"

namespace flatkv::attention {

constexpr int kMaxGroup = 16;  // query heads per KV head the kernels handle

struct DecodeKernels {
  void (*scores)(const float* q, int g, const uint16_t* k, uint32_t n, int d, float scale, float* s);
  void (*exp_shift)(float* x, uint32_t n, float m);
  void (*accumulate)(const float* p, uint32_t p_stride, int g, const uint16_t* v, uint32_t n, int d, float* acc);
  float (*dot_row)(const float* q, const uint16_t* row, int d);  // q . row
  // The certified sampler's passes (certified_sampler.h), per head over n keys:
  //   race_rates  r[i] = max(1 / E_i, inv_cap) with E_i = -ln U_i, U_i the
  //               24-bit uniform (h + 0.5) 2^-24 from h = Hash32(seed, i0 + i) >> 8
  //   weight_sums *z += sum w, *wv += sum w vn, *wvv += sum w vn^2
  //   masked_wvv  sum over w[i] < theta of w vn^2
  //   select      writes the ascending i with w[i] * r[i] >= tau to idx; returns the count
  //   gather      acc[j] += sum_m coef[m] * v[idx[m]][j] (rows of d f16)
  void (*race_rates)(uint32_t seed, uint32_t i0, uint32_t n, float inv_cap, float* r);
  void (*weight_sums)(const float* w, const float* vn, uint32_t n, double* z, double* wv, double* wvv);
  double (*masked_wvv)(const float* w, const float* vn, uint32_t n, float theta);
  uint32_t (*select)(const float* w, const float* r, uint32_t n, float tau, uint32_t* idx);
  void (*gather)(const uint32_t* idx, const float* coef, uint32_t m, const uint16_t* v, int d, float* acc);
};

const DecodeKernels& ScalarKernels();
const DecodeKernels& Avx2Kernels();  // only call when DetectedSimd() >= kAvx2
const DecodeKernels& KernelsFor(SimdLevel level);

// The race's integer hash (both kernels use it, so their U_i are identical).
inline uint32_t Hash32(uint32_t seed, uint32_t i) {
  uint32_t x = i * 0x9E3779B1u + seed;
  x ^= x >> 16;
  x *= 0x85EBCA6Bu;
  x ^= x >> 13;
  x *= 0xC2B2AE35u;
  x ^= x >> 16;
  return x;
}

}  // namespace flatkv::attention
