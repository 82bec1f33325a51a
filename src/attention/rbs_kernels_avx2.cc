// AVX2 + FMA versions of the block-sparse prefill kernels (rbs_kernels.h).
// Per key block: its keys are transposed once into kt[x][t] (t padded to a
// multiple of 8 with zeros), shared by every row; a row's scores are then
// d broadcasts times ceil(nk / 8) FMAs, and its output update one FMA per
// key and 8 columns.
#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "attention/avx2_math.h"
#include "attention/rbs_kernels.h"

namespace flatkv::attention {
namespace {

using avx2::Exp8;
using avx2::HSum;

inline float HMax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// s[t] = scale * (q . kt[:, t]) for t < ldk (ldk a multiple of 8), 8 vectors at a time.
void RowScores(const float* q, const float* kt, uint32_t ldk, int d, float scale, float* s) {
  uint32_t t0 = 0;
  for (; t0 + 64 <= ldk; t0 += 64) {
    __m256 acc[8];
    for (auto& a : acc) a = _mm256_setzero_ps();
    for (int x = 0; x < d; ++x) {
      const __m256 qb = _mm256_set1_ps(q[x]);
      const float* row = kt + uint64_t(x) * ldk + t0;
      for (int u = 0; u < 8; ++u) acc[u] = _mm256_fmadd_ps(qb, _mm256_loadu_ps(row + 8 * u), acc[u]);
    }
    for (int u = 0; u < 8; ++u) _mm256_storeu_ps(s + t0 + 8 * u, _mm256_mul_ps(acc[u], _mm256_set1_ps(scale)));
  }
  for (; t0 < ldk; t0 += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int x = 0; x < d; ++x)
      acc = _mm256_fmadd_ps(_mm256_set1_ps(q[x]), _mm256_loadu_ps(kt + uint64_t(x) * ldk + t0), acc);
    _mm256_storeu_ps(s + t0, _mm256_mul_ps(acc, _mm256_set1_ps(scale)));
  }
}

// o = o * f + sum_{t < nk} p[t] v_t.
void RowUpdate(float* o, float f, const float* p, uint32_t nk, const BlockRows& v, uint32_t j, int d) {
  int x0 = 0;
  const __m256 fv = _mm256_set1_ps(f);
  for (; x0 + 64 <= d; x0 += 64) {
    __m256 acc[8];
    for (int u = 0; u < 8; ++u) acc[u] = _mm256_mul_ps(_mm256_loadu_ps(o + x0 + 8 * u), fv);
    for (uint32_t t = 0; t < nk; ++t) {
      const __m256 pb = _mm256_set1_ps(p[t]);
      const float* row = v.row(j, t) + x0;
      for (int u = 0; u < 8; ++u) acc[u] = _mm256_fmadd_ps(pb, _mm256_loadu_ps(row + 8 * u), acc[u]);
    }
    for (int u = 0; u < 8; ++u) _mm256_storeu_ps(o + x0 + 8 * u, acc[u]);
  }
  for (; x0 + 8 <= d; x0 += 8) {
    __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(o + x0), fv);
    for (uint32_t t = 0; t < nk; ++t) acc = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), _mm256_loadu_ps(v.row(j, t) + x0), acc);
    _mm256_storeu_ps(o + x0, acc);
  }
  for (; x0 < d; ++x0) {
    float acc = o[x0] * f;
    for (uint32_t t = 0; t < nk; ++t) acc += p[t] * v.row(j, t)[x0];
    o[x0] = acc;
  }
}

void Attend(const BlockAttendArgs& a, BlockAttendScratch& sc) {
  const int d = a.d;
  const uint32_t ldk_max = (a.block + 7) / 8 * 8;
  sc.kt.resize(uint64_t(d) * ldk_max);
  sc.s.resize(ldk_max);
  sc.m.assign(a.rows, -std::numeric_limits<float>::infinity());
  sc.l.assign(a.rows, 0.0f);
  for (uint32_t r = 0; r < a.rows; ++r) std::fill(a.o + r * a.o_stride, a.o + r * a.o_stride + d, 0.0f);
  if (a.rows == 0) return;
  const uint32_t last = a.pos[a.rows - 1];
  for (uint32_t b = 0; b < a.n_blocks; ++b) {
    const uint32_t j = a.blocks[b];
    const uint64_t first = uint64_t{j} * a.block;
    if (first > last) break;
    const uint32_t nk_all = static_cast<uint32_t>(std::min<uint64_t>(a.block, last - first + 1));
    const uint32_t ldk = (nk_all + 7) / 8 * 8;
    for (uint32_t t = 0; t < nk_all; ++t) {
      const float* k = a.k.row(j, t);
      for (int x = 0; x < d; ++x) sc.kt[uint64_t(x) * ldk + t] = k[x];
    }
    for (uint32_t t = nk_all; t < ldk; ++t)
      for (int x = 0; x < d; ++x) sc.kt[uint64_t(x) * ldk + t] = 0.0f;
    // Rows before this block's first key see none of it (rows ascend).
    uint32_t r0 = 0;
    while (r0 < a.rows && a.pos[r0] < first) ++r0;
    for (uint32_t r = r0; r < a.rows; ++r) {
      const uint32_t nk = static_cast<uint32_t>(std::min<uint64_t>(nk_all, a.pos[r] - first + 1));
      float* s = sc.s.data();
      RowScores(a.q + r * a.q_stride, sc.kt.data(), ldk, d, a.scale, s);
      const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
      for (uint32_t t = nk; t < ldk; ++t) s[t] = -std::numeric_limits<float>::infinity();
      __m256 mv = ninf;
      for (uint32_t t = 0; t < ldk; t += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(s + t));
      const float bm = std::max(sc.m[r], HMax(mv));
      const float f = std::exp(sc.m[r] - bm);
      const __m256 bmv = _mm256_set1_ps(bm);
      __m256 lv = _mm256_setzero_ps();
      for (uint32_t t = 0; t < ldk; t += 8) {
        const __m256 p = Exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), bmv));
        _mm256_storeu_ps(s + t, p);
        lv = _mm256_add_ps(lv, p);
      }
      sc.l[r] = sc.l[r] * f + HSum(lv);
      sc.m[r] = bm;
      RowUpdate(a.o + r * a.o_stride, f, s, nk, a.v, j, d);
    }
  }
  for (uint32_t r = 0; r < a.rows; ++r) {
    float* o = a.o + r * a.o_stride;
    if (sc.l[r] > 0) {
      const float inv = 1.0f / sc.l[r];
      for (int x = 0; x < d; ++x) o[x] *= inv;
    }
    if (a.lse != nullptr) a.lse[r] = sc.l[r] > 0 ? sc.m[r] + std::log(sc.l[r]) : -std::numeric_limits<float>::infinity();
  }
}

void Dots(const float* q, const float* c, uint32_t n, int d, float scale, float* out) {
  for (uint32_t b = 0; b < n; ++b) {
    const float* row = c + uint64_t{b} * d;
    __m256 acc = _mm256_setzero_ps();
    int x = 0;
    for (; x + 8 <= d; x += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + x), _mm256_loadu_ps(row + x), acc);
    float dot = HSum(acc);
    for (; x < d; ++x) dot += q[x] * row[x];
    out[b] = dot * scale;
  }
}

}  // namespace

const RbsKernels* RbsAvx2Kernels() {
  static const RbsKernels k{SimdLevel::kAvx2, &Attend, &Dots};
  return &k;
}

}  // namespace flatkv::attention
#endif  // __x86_64__
