#include "attention/decode_kernels.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "attention/f16.h"

namespace flatkv::attention {
namespace {

float DotRow(const float* q, const uint16_t* row, int d) {
  float acc = 0;
  for (int j = 0; j < d; ++j) acc += q[j] * HalfToFloat(row[j]);
  return acc;
}

void Scores(const float* q, int g, const uint16_t* k, uint32_t n, int d, float scale, float* s) {
  for (uint32_t t = 0; t < n; ++t)
    for (int h = 0; h < g; ++h) s[static_cast<size_t>(h) * n + t] = scale * DotRow(q + h * d, k + size_t{t} * d, d);
}

void ExpShift(float* x, uint32_t n, float m) {
  for (uint32_t i = 0; i < n; ++i) x[i] = std::exp(x[i] - m);
}

void Accumulate(const float* p, uint32_t p_stride, int g, const uint16_t* v, uint32_t n, int d, float* acc) {
  for (uint32_t t = 0; t < n; ++t) {
    const uint16_t* row = v + size_t{t} * d;
    for (int h = 0; h < g; ++h) {
      const float w = p[static_cast<size_t>(h) * p_stride + t];
      for (int j = 0; j < d; ++j) acc[h * d + j] += w * HalfToFloat(row[j]);
    }
  }
}


void RaceRates(uint32_t seed, uint32_t i0, uint32_t n, float inv_cap, float* r) {
  for (uint32_t i = 0; i < n; ++i) {
    const float u = (static_cast<float>(Hash32(seed, i0 + i) >> 8) + 0.5f) * 0x1.0p-24f;
    r[i] = std::max(1.0f / -std::log(u), inv_cap);
  }
}

void WeightSums(const float* w, const float* vn, uint32_t n, double* z, double* wv, double* wvv) {
  double a = 0, b = 0, c = 0;
  for (uint32_t i = 0; i < n; ++i) {
    a += w[i];
    b += double(w[i]) * vn[i];
    c += double(w[i]) * vn[i] * vn[i];
  }
  *z += a;
  *wv += b;
  *wvv += c;
}

double MaskedWvv(const float* w, const float* vn, uint32_t n, float theta) {
  double s = 0;
  for (uint32_t i = 0; i < n; ++i)
    if (w[i] < theta) s += double(w[i]) * vn[i] * vn[i];
  return s;
}

uint32_t Select(const float* w, const float* r, uint32_t n, float tau, uint32_t* idx) {
  uint32_t m = 0;
  for (uint32_t i = 0; i < n; ++i)
    if (w[i] * r[i] >= tau) idx[m++] = i;
  return m;
}

void Gather(const uint32_t* idx, const float* coef, uint32_t m, const uint16_t* v, int d, float* acc) {
  for (uint32_t s = 0; s < m; ++s) {
    const uint16_t* row = v + size_t{idx[s]} * d;
    for (int j = 0; j < d; ++j) acc[j] += coef[s] * HalfToFloat(row[j]);
  }
}

}  // namespace

const DecodeKernels& ScalarKernels() {
  static const DecodeKernels k{Scores, ExpShift, Accumulate, DotRow, RaceRates, WeightSums, MaskedWvv, Select, Gather};
  return k;
}

const DecodeKernels& KernelsFor(SimdLevel level) {
  return level >= SimdLevel::kAvx2 ? Avx2Kernels() : ScalarKernels();
}

}  // namespace flatkv::attention
