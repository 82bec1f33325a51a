// The int8 and kivi decoders' arithmetic (codec/int8_codec.cc,
// codec/kivi_codec.cc, codec/group_quant.h), written once for the host and
// the device, as gpu/xxh3.h is, converting to the slice's dtype with
// codec/dtype.h's own conversions (FLATKV_HD): the CUDA kernels
// (gpu/cuda/device_ops.cu, DeviceOps::DecodeInt8/DecodeKivi and the copy
// backend's DecodeSlices) compile it with nvcc, and the CPU test
// (gpu/group_dequant_test.cc) runs it element by element on the host against
// the CPU codec's decode, bit for bit, so the kernels decode what the store
// wrote.
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

#include "codec/dtype.h"
#include "common/hd.h"
#include "flatkv/codec.h"
#include "flatkv/status.h"

namespace flatkv::gpu {

// Writes `y` as element `at` of `out`, an array of `dtype` (a DType's
// value: f32, f16 or bf16) as the CPU codec's FromFloat does.
FLATKV_HD inline void StoreElement(int dtype, float y, std::byte* out, uint64_t at) {
  if (dtype == int(DType::kF32)) reinterpret_cast<float*>(out)[at] = y;
  else if (dtype == int(DType::kF16)) reinterpret_cast<uint16_t*>(out)[at] = codec::FloatToHalf(y);
  else reinterpret_cast<uint16_t*>(out)[at] = codec::FloatToBf16(y);
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
  if (wide) return codec::BitsToFloat(uint32_t(m[0]) | uint32_t(m[1]) << 8 | uint32_t(m[2]) << 16 | uint32_t(m[3]) << 24);
  return codec::HalfToFloat(uint16_t(m[0] | m[1] << 8));
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
