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
  // The certified sampler's per-head pass (certified_sampler.h): for keys
  // with weights w[i] in [0, 1], rate r[i] = max(1/E_i, 1/cap) and value norm
  // vn[i]: lev[i] = the first grid level 2^-l the key enters at,
  // max(0, ceil(-log2(w r))) clamped to 255; *z = sum w, *wv = sum w vn;
  // buckets[b] += w vn^2 for b = bits(w) >> 22 (half-octave buckets whose
  // lower edge is the float with bits b << 22).
  void (*sampler_pass)(const float* w, const float* r, const float* vn, uint32_t n, uint8_t* lev, double* z,
                       double* wv, double* buckets);
};

const DecodeKernels& ScalarKernels();
const DecodeKernels& Avx2Kernels();  // only call when DetectedSimd() >= kAvx2
const DecodeKernels& KernelsFor(SimdLevel level);

}  // namespace flatkv::attention
