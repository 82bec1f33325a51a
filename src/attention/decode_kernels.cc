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


void SamplerPass(const float* w, const float* r, const float* vn, uint32_t n, uint8_t* lev, double* z, double* wv,
                 double* buckets) {
  float zs = 0, ws = 0;
  for (uint32_t i = 0; i < n; ++i) {
    zs += w[i];
    ws += w[i] * vn[i];
    const int e = static_cast<int>(std::bit_cast<uint32_t>(w[i] * r[i]) >> 23);  // biased exponent (x >= 0)
    lev[i] = static_cast<uint8_t>(std::clamp(127 - e, 0, 255));
  }
  *z += zs;
  *wv += ws;
  // Four interleaved copies break the dependency on a popular bucket.
  double b4[4][256] = {};
  uint32_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int c = 0; c < 4; ++c) b4[c][std::bit_cast<uint32_t>(w[i + c]) >> 22] += double(w[i + c]) * vn[i + c] * vn[i + c];
  for (; i < n; ++i) b4[0][std::bit_cast<uint32_t>(w[i]) >> 22] += double(w[i]) * vn[i] * vn[i];
  for (int b = 0; b < 256; ++b) buckets[b] += (b4[0][b] + b4[1][b]) + (b4[2][b] + b4[3][b]);
}

}  // namespace

const DecodeKernels& ScalarKernels() {
  static const DecodeKernels k{Scores, ExpShift, Accumulate, DotRow, SamplerPass};
  return k;
}

const DecodeKernels& KernelsFor(SimdLevel level) {
  return level >= SimdLevel::kAvx2 ? Avx2Kernels() : ScalarKernels();
}

}  // namespace flatkv::attention
