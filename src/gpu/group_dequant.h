// The kivi decoder's arithmetic (codec/kivi_codec.cc, codec/group_quant.h),
// written once for the host and the device, as gpu/xxh3.h is: the CUDA
// kernel (gpu/cuda/device_ops.cu, DeviceOps::DecodeKivi) compiles it with
// nvcc, and the CPU test (gpu/group_dequant_test.cc) checks it against the
// CPU codec's decode bit for bit, so the kernel decodes what the store
// wrote.
//
// A kivi body: a u8 wide flag, then per section (MHA: K then V; MLA: the
// latent then the RoPE key) its groups' lo/step pairs (f16, or f32 when
// wide; keys per channel, in [row group][channel] order, values per token,
// in [row][channel group] order), then its rows' codes, `bits` per code
// LSB-first, each row padded to a whole byte. An element is
// lo + step * code, multiplied then added (never fused), as the CPU's
// DequantScalar/DequantVec compute it.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>

#include "flatkv/codec.h"
#include "flatkv/status.h"
#include "gpu/xxh3.h"  // FLATKV_HD

namespace flatkv::gpu::kivi {

// One section of a slice: where its output and its groups are.
struct Part {
  uint64_t base = 0;   // output element offset of (row 0, channel 0)
  uint64_t meta = 0;   // byte offset in the body of its lo/step pairs
  uint64_t codes = 0;  // byte offset in the body of its rows' codes
  uint32_t row_stride = 0, rows = 0, width = 0, group = 0;
  uint32_t bits = 0;
  uint32_t per_channel = 0;  // keys: groups of `group` rows down each channel
};

FLATKV_HD inline float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
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

FLATKV_HD inline float Meta(const uint8_t* m, bool wide) {
  if (wide) return BitsToFloat(uint32_t(m[0]) | uint32_t(m[1]) << 8 | uint32_t(m[2]) << 16 | uint32_t(m[3]) << 24);
  return HalfBitsToFloat(uint16_t(m[0] | m[1] << 8));
}

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
#if defined(__CUDA_ARCH__)
  return __fadd_rn(lo, __fmul_rn(step, float(v)));
#else
  return lo + step * float(v);  // -ffp-contract=off: never fused
#endif
}

// A kivi slice (header included) read on the host: its parameters, where
// its body starts in the slice, and its sections (parts with no rows or no
// width are left out). An error names what is wrong with it.
struct Slice {
  uint32_t bits = 0, group = 0;
  bool wide = false;
  uint64_t body = 0;  // byte offset of the body (after header and parameters) in the slice
  uint64_t body_bytes = 0;
  Part part[2];
  uint32_t parts = 0;
};
Result<Slice> ParseSlice(const SliceLayout& layout, std::span<const std::byte> slice);

}  // namespace flatkv::gpu::kivi
