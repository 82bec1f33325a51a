#include "gpu/group_dequant.h"

#include <cmath>
#include <string>

#include "codec/codec_internal.h"

namespace flatkv::gpu {
namespace {

// What every decoder checks of a slice before its sections: its codec id,
// the layout's tokens, a body after the parameters and a wide flag of 0 or
// 1. Fills `s`'s body and flag; `name` names the codec in errors.
template <typename P>
Result<codec::SliceHeader> ParseBody(const SliceLayout& layout, std::span<const std::byte> slice, uint8_t codec_id,
                                     const std::string& name, ParsedSlice<P>& s) {
  FLATKV_ASSIGN_OR_RETURN(codec::SliceHeader h, codec::ParseHeader(slice));
  if (h.codec_id != codec_id)
    return Status::InvalidArgument("gpu " + name + " decode: the slice's codec id is " + std::to_string(h.codec_id));
  if (h.tokens != layout.tokens)
    return Status::InvalidArgument("gpu " + name + " decode: the slice holds " + std::to_string(h.tokens) +
                                   " tokens, the layout " + std::to_string(layout.tokens));
  if (h.body_bytes < uint64_t(h.params_bytes) + 1) return Status::Corruption("gpu " + name + " decode: an empty body");
  s.body = codec::kHeaderBytes + h.params_bytes;
  s.body_bytes = h.body_bytes - h.params_bytes;
  const uint8_t wide = uint8_t(slice[s.body]);
  if (wide > 1) return Status::Corruption(name + " decode: bad metadata flag");
  s.wide = wide == 1;
  return h;
}

// The layout's sections into `s`, one after another in the body after the
// flag: `place(sec, p)` fills a part's codec fields and its codes' offset
// (its metadata starts at p.meta) and returns where the section ends.
template <typename P, typename Place>
Status AddSections(const SliceLayout& layout, const std::string& name, ParsedSlice<P>& s, Place place) {
  uint64_t at = 1;
  for (const codec::Section& sec : codec::SplitSlice(layout).part) {
    if (sec.rows == 0 || sec.width == 0) continue;
    P p;
    p.base = sec.base;
    p.row_stride = sec.row_stride;
    p.rows = sec.rows;
    p.width = sec.width;
    p.meta = at;
    FLATKV_ASSIGN_OR_RETURN(at, place(sec, p));
    if (at > s.body_bytes) return Status::Corruption(name + " decode: truncated body");
    s.part[s.parts++] = p;
  }
  if (at != s.body_bytes) return Status::Corruption(name + " decode: " + std::to_string(s.body_bytes - at) + " trailing bytes");
  return Status::Ok();
}

}  // namespace

namespace int8 {

Result<Slice> ParseSlice(const SliceLayout& layout, std::span<const std::byte> slice) {
  Slice s;
  FLATKV_RETURN_IF_ERROR(ParseBody(layout, slice, 1, "int8", s).status());
  FLATKV_RETURN_IF_ERROR(AddSections(layout, "int8", s, [&](const codec::Section& sec, Part& p) -> Result<uint64_t> {
    if (sec.head_dim == 0 || sec.width % sec.head_dim != 0)
      return Status::InvalidArgument("gpu int8 decode: a section of width " + std::to_string(sec.width) +
                                     " is not whole heads of " + std::to_string(sec.head_dim));
    p.head_dim = sec.head_dim;
    p.codes = p.meta + uint64_t(sec.rows) * (sec.width / sec.head_dim) * (s.wide ? 4 : 2);
    return p.codes + uint64_t(sec.rows) * sec.width;
  }));
  return s;
}

}  // namespace int8

namespace kivi {

Result<Slice> ParseSlice(const SliceLayout& layout, std::span<const std::byte> slice) {
  Slice s;
  FLATKV_ASSIGN_OR_RETURN(codec::SliceHeader h, ParseBody(layout, slice, 2, "kivi", s));
  if (h.params_bytes != 16)
    return Status::Corruption("gpu kivi decode: " + std::to_string(h.params_bytes) + " parameter bytes, expected 16");
  double bits, group;
  std::memcpy(&bits, slice.data() + codec::kHeaderBytes, 8);
  std::memcpy(&group, slice.data() + codec::kHeaderBytes + 8, 8);
  if (bits != 2 && bits != 4) return Status::Corruption("gpu kivi decode: bits=" + std::to_string(bits));
  if (!(group >= 4 && group <= 1024) || group != std::floor(group))
    return Status::Corruption("gpu kivi decode: group=" + std::to_string(group));
  s.bits = uint32_t(bits);
  s.group = uint32_t(group);
  FLATKV_RETURN_IF_ERROR(AddSections(layout, "kivi", s, [&](const codec::Section& sec, Part& p) -> Result<uint64_t> {
    p.group = s.group;
    p.bits = s.bits;
    p.per_channel = sec.key ? 1 : 0;  // KiviCodec::Group
    p.codes = p.meta + Groups(p) * 2 * (s.wide ? 4 : 2);
    return p.codes + RowBytes(p.width, p.bits) * p.rows;
  }));
  return s;
}

}  // namespace kivi
}  // namespace flatkv::gpu
