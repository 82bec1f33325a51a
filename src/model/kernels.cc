// The scalar reference kernels (kernels.h) and their dispatch. These are
// the transformer's original loops; the fast paths are tested against them
// bit for bit (kernels_test.cc).
#include "model/kernels.h"

#include <algorithm>
#include <cmath>

#include "model/fp_math.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#endif

namespace flatkv::model {
namespace {

using fp::Dot;
using fp::Exp;
using fp::kLanes;
using fp::Sum;
using fp::WeightedSum;

constexpr int kTokenTile = 4;  // tokens sharing one pass over a weight row

void MatMulRowsScalar(const float* x, const float* w, int n, int in, int out, int r0, int r1, float* y) {
  for (int t0 = 0; t0 < n; t0 += kTokenTile) {
    const int t1 = std::min(n, t0 + kTokenTile);
    for (int i = r0; i < r1; ++i) {
      const float* row = w + static_cast<size_t>(i) * in;
      for (int t = t0; t < t1; ++t) y[static_cast<size_t>(t) * out + i] = Dot(x + static_cast<size_t>(t) * in, row, in);
    }
  }
}

// One query's attention over keys 0..p: the transformer's original loop.
void AttendOne(const float* qh, int hs, const KvCache& cache, int layer, int kv_off, uint32_t p, float sqrt_hs,
               float* att, float* oh) {
  const int kv_dim = cache.kv_dim();
  const uint32_t bt = cache.block_tokens();
  // Scores, one block of contiguous key rows at a time.
  float max = -INFINITY;
  for (uint32_t s0 = 0; s0 <= p; s0 += bt) {
    const float* kb = cache.k(layer, s0) + kv_off;
    const uint32_t s1 = std::min(p + 1, s0 + bt);
    for (uint32_t s = s0; s < s1; ++s) {
      att[s] = Dot(qh, kb + static_cast<size_t>(s - s0) * kv_dim, hs) / sqrt_hs;
      max = std::max(max, att[s]);
    }
  }
  const int len = static_cast<int>(p) + 1;
  for (int s = 0; s < len; ++s) att[s] = Exp(att[s] - max);
  const float sum = Sum(att, len);
  for (int s = 0; s < len; ++s) att[s] /= sum;
  for (int i0 = 0; i0 < hs; i0 += kLanes) {
    const int m = std::min(kLanes, hs - i0);
    float acc[kLanes] = {};
    for (uint32_t s0 = 0; s0 <= p; s0 += bt) {
      const uint32_t s1 = std::min(p + 1, s0 + bt);
      WeightedSum(att + s0, cache.v(layer, s0) + kv_off + i0, kv_dim, static_cast<int>(s1 - s0), m, acc);
    }
    std::copy(acc, acc + m, oh + i0);
  }
}

void AttendScalar(const float* q, int q_stride, const uint32_t* pos, int nt, int group, int hs, const KvCache& cache,
                  int layer, int kv_off, float sqrt_hs, float* att, float* o) {
  for (int t = 0; t < nt; ++t)
    for (int g = 0; g < group; ++g) {
      const size_t off = static_cast<size_t>(t) * q_stride + static_cast<size_t>(g) * hs;
      AttendOne(q + off, hs, cache, layer, kv_off, pos[t], sqrt_hs, att, o + off);
    }
}

}  // namespace

namespace internal {
const Kernels& ScalarKernels() {
  static const Kernels k{SimdLevel::kScalar, MatMulRowsScalar, AttendScalar};
  return k;
}
#if !defined(__x86_64__)
const Kernels* Avx2Kernels() { return nullptr; }
const Kernels* Avx512Kernels() { return nullptr; }
#endif
}  // namespace internal

const Kernels& KernelsFor(SimdLevel level) {
  if (level >= SimdLevel::kAvx512 && internal::Avx512Kernels() != nullptr) return *internal::Avx512Kernels();
  if (level >= SimdLevel::kAvx2 && internal::Avx2Kernels() != nullptr) return *internal::Avx2Kernels();
  return internal::ScalarKernels();
}

const Kernels& DefaultKernels() {
  static const Kernels& k = KernelsFor(DetectedSimd());
  return k;
}

}  // namespace flatkv::model
