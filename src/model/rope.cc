#include "model/rope.h"

#include <algorithm>
#include <cmath>

// Each product and sum rounded on its own (see model/transformer.cc).
#if defined(__clang__)
#pragma clang fp contract(off)
#endif

namespace flatkv::model {

void ApplyRope(float* rows, uint32_t n, size_t row_stride, uint32_t offset, uint32_t heads, uint32_t head_dim,
               const uint32_t* pos, const RopeSpec& spec) {
  const uint32_t rotary = spec.rotary_dim == 0 ? head_dim : spec.rotary_dim;
  const uint32_t half = rotary / 2;
  // The pair of frequency f: (v[f * a_step], v[f * a_step + b_off]).
  const uint32_t a_step = spec.style == RopeStyle::kNeox ? 1 : 2;
  const uint32_t b_off = spec.style == RopeStyle::kNeox ? half : 1;
  constexpr uint32_t kChunk = 32;  // frequencies handled per pass, on the stack
  for (uint32_t f0 = 0; f0 < half; f0 += kChunk) {
    const uint32_t m = std::min(kChunk, half - f0);
    double freq[kChunk];
    for (uint32_t f = 0; f < m; ++f) freq[f] = std::pow(spec.theta, -2.0 * (f0 + f) / rotary);
    for (uint32_t t = 0; t < n; ++t) {
      const double p = static_cast<double>(pos[t]);
      float cr[kChunk], ci[kChunk];
      for (uint32_t f = 0; f < m; ++f) {
        cr[f] = static_cast<float>(std::cos(p * freq[f]));
        ci[f] = static_cast<float>(std::sin(p * freq[f]));
      }
      float* row = rows + t * row_stride + offset;
      for (uint32_t h = 0; h < heads; ++h) {
        float* v = row + size_t{h} * head_dim;
        for (uint32_t f = 0; f < m; ++f) {
          float* a = v + (f0 + f) * a_step;
          float* b = a + b_off;
          const float v0 = *a, v1 = *b;
          *a = v0 * cr[f] - v1 * ci[f];
          *b = v0 * ci[f] + v1 * cr[f];
        }
      }
    }
  }
}

}  // namespace flatkv::model
