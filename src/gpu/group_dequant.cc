#include "gpu/group_dequant.h"

#include <cmath>
#include <string>

#include "codec/codec_internal.h"

namespace flatkv::gpu {

namespace int8 {

Result<Slice> ParseSlice(const SliceLayout& layout, std::span<const std::byte> slice) {
  FLATKV_ASSIGN_OR_RETURN(codec::SliceHeader h, codec::ParseHeader(slice));
  if (h.codec_id != 1) return Status::InvalidArgument("gpu int8 decode: the slice's codec id is " + std::to_string(h.codec_id));
  if (h.tokens != layout.tokens)
    return Status::InvalidArgument("gpu int8 decode: the slice holds " + std::to_string(h.tokens) + " tokens, the layout " +
                                   std::to_string(layout.tokens));
  Slice s;
  if (h.body_bytes < uint64_t(h.params_bytes) + 1) return Status::Corruption("gpu int8 decode: an empty body");
  s.body = codec::kHeaderBytes + h.params_bytes;
  s.body_bytes = h.body_bytes - h.params_bytes;
  const uint8_t wide = uint8_t(slice[s.body]);
  if (wide > 1) return Status::Corruption("int8 decode: bad metadata flag");
  s.wide = wide == 1;
  uint64_t at = 1;
  for (const codec::Section& sec : codec::SplitSlice(layout).part) {
    if (sec.rows == 0 || sec.width == 0) continue;
    if (sec.head_dim == 0 || sec.width % sec.head_dim != 0)
      return Status::InvalidArgument("gpu int8 decode: a section of width " + std::to_string(sec.width) +
                                     " is not whole heads of " + std::to_string(sec.head_dim));
    Part p;
    p.base = sec.base;
    p.row_stride = sec.row_stride;
    p.rows = sec.rows;
    p.width = sec.width;
    p.head_dim = sec.head_dim;
    p.meta = at;
    p.codes = p.meta + uint64_t(sec.rows) * (sec.width / sec.head_dim) * (s.wide ? 4 : 2);
    at = p.codes + uint64_t(sec.rows) * sec.width;
    if (at > s.body_bytes) return Status::Corruption("int8 decode: truncated body");
    s.part[s.parts++] = p;
  }
  if (at != s.body_bytes) return Status::Corruption("int8 decode: " + std::to_string(s.body_bytes - at) + " trailing bytes");
  return s;
}

}  // namespace int8

namespace kivi {

Result<Slice> ParseSlice(const SliceLayout& layout, std::span<const std::byte> slice) {
  FLATKV_ASSIGN_OR_RETURN(codec::SliceHeader h, codec::ParseHeader(slice));
  if (h.codec_id != 2) return Status::InvalidArgument("gpu kivi decode: the slice's codec id is " + std::to_string(h.codec_id));
  if (h.params_bytes != 16)
    return Status::Corruption("gpu kivi decode: " + std::to_string(h.params_bytes) + " parameter bytes, expected 16");
  if (h.tokens != layout.tokens)
    return Status::InvalidArgument("gpu kivi decode: the slice holds " + std::to_string(h.tokens) + " tokens, the layout " +
                                   std::to_string(layout.tokens));
  if (h.body_bytes < uint64_t(h.params_bytes) + 1) return Status::Corruption("gpu kivi decode: an empty body");
  double bits, group;
  std::memcpy(&bits, slice.data() + codec::kHeaderBytes, 8);
  std::memcpy(&group, slice.data() + codec::kHeaderBytes + 8, 8);
  if (bits != 2 && bits != 4) return Status::Corruption("gpu kivi decode: bits=" + std::to_string(bits));
  if (!(group >= 4 && group <= 1024) || group != std::floor(group))
    return Status::Corruption("gpu kivi decode: group=" + std::to_string(group));
  Slice s;
  s.bits = uint32_t(bits);
  s.group = uint32_t(group);
  s.body = codec::kHeaderBytes + h.params_bytes;
  s.body_bytes = h.body_bytes - h.params_bytes;
  const uint8_t wide = uint8_t(slice[s.body]);
  if (wide > 1) return Status::Corruption("kivi decode: bad metadata flag");
  s.wide = wide == 1;
  uint64_t at = 1;
  for (const codec::Section& sec : codec::SplitSlice(layout).part) {
    if (sec.rows == 0 || sec.width == 0) continue;
    Part p;
    p.base = sec.base;
    p.row_stride = sec.row_stride;
    p.rows = sec.rows;
    p.width = sec.width;
    p.group = s.group;
    p.bits = s.bits;
    p.per_channel = sec.key ? 1 : 0;  // KiviCodec::Group
    p.meta = at;
    p.codes = p.meta + Groups(p) * 2 * (s.wide ? 4 : 2);
    at = p.codes + RowBytes(p.width, p.bits) * p.rows;
    if (at > s.body_bytes) return Status::Corruption("kivi decode: truncated group data");
    s.part[s.parts++] = p;
  }
  if (at != s.body_bytes) return Status::Corruption("kivi decode: " + std::to_string(s.body_bytes - at) + " trailing bytes");
  return s;
}

}  // namespace kivi
}  // namespace flatkv::gpu
