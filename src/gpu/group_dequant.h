// The int8 and kivi decoders' arithmetic (codec/int8_codec.cc,
// codec/kivi_codec.cc, codec/group_quant.h) and the conversion of a decoded
// float to the slice's dtype (codec/dtype.h), written once for the host and
// the device, as gpu/xxh3.h is: the CUDA kernels (gpu/cuda/device_ops.cu,
// DeviceOps::DecodeInt8/DecodeKivi and the copy backend's DecodeSlices)
// compile it with nvcc, and the CPU test (gpu/group_dequant_test.cc) runs
// it element by element on the host against the CPU codec's decode, bit for
// bit, so the kernels decode what the store wrote.
//
// An int8 body: a u8 wide flag, then per section (MHA: K then V; MLA: the
// latent then the RoPE key) its scales [row][head] (f16, or f32 when wide),
// then its codes [row][channel], one byte each; an element is
// lo + scale * code with lo = -128 * scale, multiplied then added.
//
// A kivi body: a u8 wide flag, then per section its groups' lo/step pairs
// (f16, or f32 when wide; keys per channel, in [row group][channel] order,
// values per token, in [row][channel group] order), then its rows' codes,
// `bits` per code LSB-first, each row padded to a whole byte. An element is
// lo + step * code, multiplied then added (never fused), as the CPU's
// DequantScalar/DequantVec compute it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "flatkv/codec.h"
#include "flatkv/status.h"
#include "gpu/xxh3.h"  // FLATKV_HD

namespace flatkv::gpu {

FLATKV_HD inline float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}
FLATKV_HD inline uint32_t FloatToBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

// An IEEE half's value (codec/dtype.h's HalfToFloat, exactly).
FLATKV_HD inline float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  if (exp == 0x1F) return BitsToFloat(sign | 0x7F800000u | (man << 13));
  if (exp != 0) return BitsToFloat(sign | ((exp + 112) << 23) | (man << 13));
  const float v = float(man) * 5.9604644775390625e-08f;  // exact: man * 2^-24
  return sign ? -v : v;
}

// A float rounded to bf16 bits, nearest even; NaNs keep their payload's top
// bits (codec/dtype.h's FloatToBf16, exactly).
FLATKV_HD inline uint16_t FloatToBf16Bits(float f) {
  uint32_t u = FloatToBits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u & 0x007F0000u) ? uint16_t(u >> 16) : uint16_t((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

// A float rounded to half bits, nearest even, overflowing to infinity
// (codec/dtype.h's FloatToHalf, exactly).
FLATKV_HD inline uint16_t FloatToHalfBits(float f) {
  const uint32_t u = FloatToBits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) {
    const uint16_t m = uint16_t((a >> 13) & 0x3FF);
    return uint16_t(sign | 0x7C00 | (m ? m : 0x200));
  }
  if (a >= 0x477FF000u) return uint16_t(sign | 0x7C00);
  if (a >= 0x38800000u) {
    const uint32_t r = a - 0x38000000u;
    const uint32_t rounded = r + 0xFFFu + ((r >> 13) & 1);
    return uint16_t(sign | (rounded >> 13));
  }
  const float scaled = BitsToFloat(a) * 16777216.0f;  // exact (a power of two)
  uint32_t m = uint32_t(scaled);
  const float frac = scaled - float(m);
  if (frac > 0.5f || (frac == 0.5f && (m & 1))) ++m;
  return uint16_t(sign | m);
}

// Writes `y` as element `at` of `out`, an array of `dtype` (a DType's
// value: f32, f16 or bf16) as the CPU codec's FromFloat does.
FLATKV_HD inline void StoreElement(int dtype, float y, std::byte* out, uint64_t at) {
  if (dtype == int(DType::kF32)) reinterpret_cast<float*>(out)[at] = y;
  else if (dtype == int(DType::kF16)) reinterpret_cast<uint16_t*>(out)[at] = FloatToHalfBits(y);
  else reinterpret_cast<uint16_t*>(out)[at] = FloatToBf16Bits(y);
}

// lo + step * v, multiplied then added, never fused (nvcc builds with
// --fmad=false and the host with -ffp-contract=off; the intrinsics say it
// again where it matters).
FLATKV_HD inline float MulAdd(float lo, float step, float v) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(lo, __fmul_rn(step, v));
#else
  return lo + step * v;
#endif
}

FLATKV_HD inline float Meta(const uint8_t* m, bool wide) {
  if (wide) return BitsToFloat(uint32_t(m[0]) | uint32_t(m[1]) << 8 | uint32_t(m[2]) << 16 | uint32_t(m[3]) << 24);
  return HalfBitsToFloat(uint16_t(m[0] | m[1] << 8));
}

// A slice read on the host: where its body starts in the slice, whether
// its metadata is f32 (wide), and its sections (parts with no rows or no
// width are left out), each a P (int8::Part, kivi::Part).
template <typename P>
struct ParsedSlice {
  bool wide = false;
  uint64_t body = 0;  // byte offset of the body (after header and parameters) in the slice
  uint64_t body_bytes = 0;
  P part[2];
  uint32_t parts = 0;
};

namespace int8 {

// One section of a slice: where its output, its scales and its codes are.
struct Part {
  uint64_t base = 0;   // output element offset of (row 0, channel 0)
  uint64_t meta = 0;   // byte offset in the body of its scales
  uint64_t codes = 0;  // byte offset in the body of its rows' codes
  uint32_t row_stride = 0, rows = 0, width = 0, head_dim = 0;
};

// Element (row, c) of section `p` of the body at `body`, as a float.
FLATKV_HD inline float Element(const uint8_t* body, const Part& p, bool wide, uint32_t row, uint32_t c) {
  const uint32_t heads = p.width / p.head_dim, h = c / p.head_dim;
  const float scale = Meta(body + p.meta + (uint64_t(row) * heads + h) * (wide ? 4 : 2), wide);
#if defined(__CUDA_ARCH__)
  const float lo = __fmul_rn(-128.0f, scale);
#else
  const float lo = -128.0f * scale;
#endif
  return MulAdd(lo, scale, float(body[p.codes + uint64_t(row) * p.width + c]));
}

// An int8 slice (header included) read on the host. An error names what
// is wrong with it.
using Slice = ParsedSlice<Part>;
Result<Slice> ParseSlice(const SliceLayout& layout, std::span<const std::byte> slice);

}  // namespace int8

namespace kivi {

// One section of a slice: where its output and its groups are.
struct Part {
  uint64_t base = 0;   // output element offset of (row 0, channel 0)
  uint64_t meta = 0;   // byte offset in the body of its lo/step pairs
  uint64_t codes = 0;  // byte offset in the body of its rows' codes
  uint32_t row_stride = 0, rows = 0, width = 0, group = 0;
  uint32_t bits = 0;
  uint32_t per_channel = 0;  // keys: groups of `group` rows down each channel
};

// Bytes of one row's codes.
FLATKV_HD inline uint64_t RowBytes(uint32_t width, uint32_t bits) { return (uint64_t(width) * bits + 7) / 8; }

// Groups (lo/step pairs) of a section.
FLATKV_HD inline uint64_t Groups(const Part& p) {
  return p.per_channel ? uint64_t((p.rows + p.group - 1) / p.group) * p.width
                       : uint64_t(p.rows) * ((p.width + p.group - 1) / p.group);
}

// Element (row, c) of section `p` of the body at `body`, as a float.
FLATKV_HD inline float Element(const uint8_t* body, const Part& p, bool wide, uint32_t row, uint32_t c) {
  const uint64_t g = p.per_channel ? uint64_t(row / p.group) * p.width + c
                                   : uint64_t(row) * ((p.width + p.group - 1) / p.group) + c / p.group;
  const uint32_t msz = wide ? 4 : 2;
  const uint8_t* m = body + p.meta + g * 2 * msz;
  const float lo = Meta(m, wide), step = Meta(m + msz, wide);
  const uint8_t* packed = body + p.codes + RowBytes(p.width, p.bits) * row;
  const uint64_t bit = uint64_t(c) * p.bits;
  uint32_t v = packed[bit >> 3] >> (bit & 7);
  if ((bit & 7) + p.bits > 8) v |= uint32_t(packed[(bit >> 3) + 1]) << (8 - (bit & 7));
  v &= (1u << p.bits) - 1;
  return MulAdd(lo, step, float(v));
}

// A kivi slice (header included) read on the host, with its parameters.
// An error names what is wrong with it.
struct Slice : ParsedSlice<Part> {
  uint32_t bits = 0, group = 0;
};
Result<Slice> ParseSlice(const SliceLayout& layout, std::span<const std::byte> slice);

}  // namespace kivi
}  // namespace flatkv::gpu
