// The randomized block-diagonal Hadamard rotation hadamard-int4 and turbo
// share: each head vector's elements are multiplied by seeded random signs,
// then each block of B (a power of two dividing head_dim, at most the
// codec's `block` parameter) goes through an orthonormal Walsh-Hadamard
// transform (scale 1/sqrt(B)). The inverse is the same in reverse order.
#pragma once

#include <cstdint>

#include "codec/codec_internal.h"

namespace flatkv::codec {

// The block used for vectors of `head_dim`: the largest power of two that
// divides head_dim and is <= max_block (1 = no rotation).
uint32_t RotationBlock(uint32_t head_dim, uint32_t max_block);
// Signs (+1/-1) for one part of a slice, `width` floats, the same for every
// head (the pattern repeats with period head_dim).
void RotationSigns(uint64_t seed, int part, uint32_t head_dim, uint32_t width, float* signs);

}  // namespace flatkv::codec
