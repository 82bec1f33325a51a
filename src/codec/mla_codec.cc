// mla: role-aware bit allocation for MLA slices. The latent vector feeds
// both attention scores (through the absorbed key projection) and outputs
// (through the value projection); the decoupled RoPE key feeds only the
// scores but carries the positional signal, and is small (64 of 576
// elements in DeepSeek-V3), so it gets more bits. Both parts are
// quantized per token in groups of `group` channels, asymmetric min-max
// (codec/group_quant.h), with latent_bits and rope_bits.
//
// Body: u8 wide flag; the latent's groups; the rope key's groups.
#include "codec/codec_internal.h"
#include "codec/group_quant.h"

namespace flatkv::codec {
namespace {

class MlaCodec final : public LossyCodec {
 public:
  MlaCodec()
      : LossyCodec({{"latent_bits", "bits per latent element", 2, 8, 4, true},
                    {"rope_bits", "bits per RoPE-key element", 2, 8, 8, true},
                    {"group", "channels per quantization group", 4, 1024, 32, true}}) {}
  std::string_view name() const override { return "mla"; }
  uint8_t id() const override { return 6; }

 protected:
  Status SupportsFloats(const SliceLayout& layout) const override {
    if (layout.shape.kind != AttentionKind::kMla)
      return Status::InvalidArgument("mla codec: needs an MLA slice, got " + layout.shape.ToString());
    return Status::Ok();
  }

 public:
  bool FixedSize() const override { return false; }
  bool Lossless() const override { return false; }

 protected:
  uint64_t BodyBound(const SliceLayout& layout) const override {
    if (layout.shape.kind != AttentionKind::kMla) return 0;
    const Sections p = SplitSlice(layout);
    return 1 + GroupQuantBound(p.part[0], Grouping::kPerToken, Bits(0), group()) +
           GroupQuantBound(p.part[1], Grouping::kPerToken, Bits(1), group());
  }
  bool EncodeFloats(CodecContext& ctx, const SliceLayout& layout, const float* x, ByteWriter& w) const override {
    const bool wide = NeedsWideMeta(x, layout.Elements());
    if (!w.Put<uint8_t>(wide)) return false;
    auto* codes = reinterpret_cast<uint8_t*>(ctx.Scratch(1, layout.Elements()));
    const Sections p = SplitSlice(layout);
    for (int i = 0; i < 2; ++i)
      if (!EncodeGroupQuant(p.part[i], Grouping::kPerToken, Bits(i), group(), wide, x, w, codes)) return false;
    return true;
  }
  Status DecodeFloats(CodecContext&, const SliceLayout& layout, ByteReader& r, float* y) const override {
    uint8_t wide = 0;
    if (!r.Get(wide) || wide > 1) return BodyCorrupt("mla", "bad metadata flag");
    const Sections p = SplitSlice(layout);
    for (int i = 0; i < 2; ++i)
      FLATKV_RETURN_IF_ERROR(DecodeGroupQuant("mla", p.part[i], Grouping::kPerToken, Bits(i), group(), wide, r, y,
                                              nullptr, ActiveKernels()));
    return Status::Ok();
  }

 private:
  int Bits(int part) const { return int(param(part)); }
  uint32_t group() const { return uint32_t(param(2)); }
};

}  // namespace

std::unique_ptr<Codec> MakeMlaCodec() { return std::make_unique<MlaCodec>(); }

}  // namespace flatkv::codec
