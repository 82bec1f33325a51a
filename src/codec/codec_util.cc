// Helpers the codecs share (codec_internal.h).
#include <cmath>

#include "codec/codec_internal.h"
#include "codec/dtype.h"

namespace flatkv::codec {

Result<size_t> BeginEncode(const Codec& codec, const SliceLayout& layout, std::span<const std::byte> in,
                           std::span<std::byte> out) {
  FLATKV_RETURN_IF_ERROR(codec.Supports(layout));
  if (in.size() != layout.Bytes())
    return Status::InvalidArgument(std::string(codec.name()) + " encode: input of " + std::to_string(in.size()) +
                                   " bytes for a " + std::to_string(layout.Bytes()) + "-byte slice");
  if (out.size() < codec.MaxEncodedSize(layout))
    return Status::InvalidArgument(std::string(codec.name()) + " encode: output of " + std::to_string(out.size()) +
                                   " bytes, needs MaxEncodedSize " + std::to_string(codec.MaxEncodedSize(layout)));
  return WriteHeader(codec, layout, out);
}

Sections SplitSlice(const SliceLayout& layout) {
  const KvShape& s = layout.shape;
  Sections out;
  if (s.kind == AttentionKind::kMla) {
    const uint32_t w = s.latent_dim + s.rope_dim;
    out.part[0] = {0, w, layout.tokens, s.latent_dim, s.latent_dim, false};
    out.part[1] = {s.latent_dim, w, layout.tokens, s.rope_dim, s.rope_dim, true};
  } else {
    const uint32_t kv = s.kv_heads * s.head_dim;
    out.part[0] = {0, kv, layout.tokens, kv, s.head_dim, true};
    out.part[1] = {uint64_t(layout.tokens) * kv, kv, layout.tokens, kv, s.head_dim, false};
  }
  return out;
}

Status BodyCorrupt(std::string_view codec, std::string_view what) {
  return Status::Corruption(std::string(codec) + " decode: " + std::string(what));
}

bool NeedsWideMeta(const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (!(std::fabs(x[i]) <= 16384.0f)) return true;
  return false;
}

float RoundMeta(float v, bool wide) { return wide ? v : HalfToFloat(FloatToHalf(v)); }

bool PutMeta(ByteWriter& w, float v, bool wide) { return wide ? w.Put<float>(v) : w.Put<uint16_t>(FloatToHalf(v)); }

bool GetMeta(ByteReader& r, bool wide, float& v) {
  if (wide) return r.Get(v);
  uint16_t h;
  if (!r.Get(h)) return false;
  v = HalfToFloat(h);
  return true;
}

}  // namespace flatkv::codec

namespace flatkv::codec {

Result<size_t> LossyCodec::Encode(CodecContext& ctx, const SliceLayout& layout, std::span<const std::byte> in,
                                  std::span<std::byte> out) const {
  FLATKV_ASSIGN_OR_RETURN(const size_t h, BeginEncode(*this, layout, in, out));
  const uint64_t n = layout.Elements();
  float* x = reinterpret_cast<float*>(ctx.Scratch(0, n * sizeof(float)));
  ToFloat(layout.shape.dtype, in.data(), x, n);
  ByteWriter w(out.first(MaxEncodedSize(layout)), h);
  if (!EncodeFloats(ctx, layout, x, w))
    return Status::Aborted(std::string(name()) + " encode: body exceeded MaxEncodedSize");
  SetBodyBytes(out, uint32_t(w.size() - kHeaderBytes));
  return w.size();
}

Status LossyCodec::Supports(const SliceLayout& layout) const {
  if (!DTypeConvertsToFloat(layout.shape.dtype))
    return Status::InvalidArgument(std::string(name()) + " codec: computes on f16, bf16 or f32 elements, not " +
                                   std::string(DTypeName(layout.shape.dtype)) +
                                   ", which is stored as its bytes (codec raw)");
  return SupportsFloats(layout);
}

Status LossyCodec::Decode(CodecContext& ctx, const SliceLayout& layout, std::span<const std::byte> in,
                          std::span<std::byte> out) const {
  FLATKV_RETURN_IF_ERROR(Supports(layout));
  const uint64_t n = layout.Elements();
  const bool direct = layout.shape.dtype == DType::kF32 && reinterpret_cast<uintptr_t>(out.data()) % 4 == 0;
  float* y =
      direct ? reinterpret_cast<float*>(out.data()) : reinterpret_cast<float*>(ctx.Scratch(0, n * sizeof(float)));
  ByteReader r(in);
  FLATKV_RETURN_IF_ERROR(DecodeFloats(ctx, layout, r, y));
  if (r.remaining() != 0) return BodyCorrupt(name(), std::to_string(r.remaining()) + " trailing bytes");
  if (!direct) FromFloat(layout.shape.dtype, y, out.data(), n);
  return Status::Ok();
}

}  // namespace flatkv::codec
