#include "codec/rotation.h"

namespace flatkv::codec {

uint32_t RotationBlock(uint32_t head_dim, uint32_t max_block) {
  if (head_dim == 0) return 1;
  uint32_t b = head_dim & (~head_dim + 1);  // lowest set bit
  while (b > max_block) b /= 2;
  return b == 0 ? 1 : b;
}

void RotationSigns(uint64_t seed, int part, uint32_t head_dim, uint32_t width, float* signs) {
  for (uint32_t c = 0; c < width; ++c) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + uint64_t(part) * 0xD1B54A32D192ED03ull + (c % head_dim);
    x = (x ^ (x >> 31)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 29)) * 0x94D049BB133111EBull;
    x ^= x >> 32;
    signs[c] = (x & 1) ? -1.0f : 1.0f;
  }
}

}  // namespace flatkv::codec
