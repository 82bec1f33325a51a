// The scalar reference of the block-sparse prefill kernels (rbs_kernels.h).
#include "attention/rbs_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace flatkv::attention {
namespace {

void Attend(const BlockAttendArgs& a, BlockAttendScratch& scratch) {
  const int d = a.d;
  scratch.s.resize(a.block);
  for (uint32_t r = 0; r < a.rows; ++r) {
    const float* q = a.q + r * a.q_stride;
    float* o = a.o + r * a.o_stride;
    std::fill(o, o + d, 0.0f);
    float m = -std::numeric_limits<float>::infinity(), l = 0;
    for (uint32_t b = 0; b < a.n_blocks; ++b) {
      const uint32_t j = a.blocks[b];
      const uint64_t first = uint64_t{j} * a.block;
      if (first > a.pos[r]) break;  // ascending blocks: the rest are in the future
      const uint32_t nk = static_cast<uint32_t>(std::min<uint64_t>(a.block, a.pos[r] - first + 1));
      float bm = m;
      for (uint32_t t = 0; t < nk; ++t) {
        const float* k = a.k.row(j, t);
        float dot = 0;
        for (int x = 0; x < d; ++x) dot += q[x] * k[x];
        scratch.s[t] = dot * a.scale;
        bm = std::max(bm, scratch.s[t]);
      }
      const float f = std::exp(m - bm);  // 0 on the first block (m = -inf)
      l *= f;
      for (int x = 0; x < d; ++x) o[x] *= f;
      for (uint32_t t = 0; t < nk; ++t) {
        const float p = std::exp(scratch.s[t] - bm);
        l += p;
        const float* v = a.v.row(j, t);
        for (int x = 0; x < d; ++x) o[x] += p * v[x];
      }
      m = bm;
    }
    if (l > 0) {
      const float inv = 1.0f / l;
      for (int x = 0; x < d; ++x) o[x] *= inv;
    }
    if (a.lse != nullptr) a.lse[r] = l > 0 ? m + std::log(l) : -std::numeric_limits<float>::infinity();
  }
}

void Dots(const float* q, const float* c, uint32_t n, int d, float scale, float* out) {
  for (uint32_t b = 0; b < n; ++b) {
    float dot = 0;
    for (int x = 0; x < d; ++x) dot += q[x] * c[uint64_t{b} * d + x];
    out[b] = dot * scale;
  }
}

}  // namespace

#if !defined(__x86_64__)
const RbsKernels* RbsAvx2Kernels() { return nullptr; }
#endif

const RbsKernels& RbsScalarKernels() {
  static const RbsKernels k{SimdLevel::kScalar, &Attend, &Dots};
  return k;
}

const RbsKernels& RbsKernelsFor(SimdLevel level) {
  if (level >= SimdLevel::kAvx2 && DetectedSimd() >= SimdLevel::kAvx2) {
    if (const RbsKernels* k = RbsAvx2Kernels()) return *k;
  }
  return RbsScalarKernels();
}

}  // namespace flatkv::attention
