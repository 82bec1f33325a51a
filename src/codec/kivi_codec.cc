// kivi: KIVI's asymmetric min-max quantization (Liu et al., 2024): keys
// per channel (groups of `group` tokens down each channel), values per
// token (groups of `group` channels along each token); MLA's RoPE key is
// treated as a key, its latent as a value. Layout: codec/group_quant.h.
//
// KIVI also keeps the most recent 128 tokens of a sequence in full
// precision. A slice is one block of one layer and does not know where the
// sequence ends, so the codec cannot apply that window itself: the caller
// does (a store keeps the still-growing tail blocks raw; `flatkv bench
// codecs` reports kivi both without the window and with the last 128
// tokens of each sequence exact).
//
// Body: u8 wide flag; then the keys' (or latent's) groups, then the
// values' (or rope's) groups.
#include "codec/codec_internal.h"
#include "codec/group_quant.h"

namespace flatkv::codec {
namespace {

class KiviCodec final : public LossyCodec {
 public:
  KiviCodec()
      : LossyCodec({{"bits", "bits per element: 2 or 4", 2, 4, 4, true},
                    {"group", "group size (tokens for keys, channels for values)", 4, 1024, 32, true}}) {}
  std::string_view name() const override { return "kivi"; }
  uint8_t id() const override { return 2; }

 protected:
  Status SupportsFloats(const SliceLayout& layout) const override {
    if (param(0) == 3) return Status::InvalidArgument("kivi: bits=3 is not supported (use 2 or 4)");
    return Status::Ok();
  }

 public:
  bool FixedSize() const override { return false; }
  bool Lossless() const override { return false; }

 protected:
  uint64_t BodyBound(const SliceLayout& layout) const override {
    uint64_t b = 1;
    for (const Section& s : SplitSlice(layout).part) b += GroupQuantBound(s, Group(s), bits(), group());
    return b;
  }
  bool EncodeFloats(CodecContext& ctx, const SliceLayout& layout, const float* x, ByteWriter& w) const override {
    const bool wide = NeedsWideMeta(x, layout.Elements());
    if (!w.Put<uint8_t>(wide)) return false;
    auto* codes = reinterpret_cast<uint8_t*>(ctx.Scratch(1, layout.Elements()));
    for (const Section& s : SplitSlice(layout).part)
      if (!EncodeGroupQuant(s, Group(s), bits(), group(), wide, x, w, codes)) return false;
    return true;
  }
  Status DecodeFloats(CodecContext& ctx, const SliceLayout& layout, ByteReader& r, float* y) const override {
    uint8_t wide = 0;
    if (!r.Get(wide) || wide > 1) return BodyCorrupt("kivi", "bad metadata flag");
    for (const Section& s : SplitSlice(layout).part) {
      auto* meta = reinterpret_cast<float*>(ctx.Scratch(1, 2 * sizeof(float) * (s.width + 1)));
      FLATKV_RETURN_IF_ERROR(DecodeGroupQuant("kivi", s, Group(s), bits(), group(), wide, r, y, meta, ActiveKernels()));
    }
    return Status::Ok();
  }

 private:
  int bits() const { return int(param(0)); }
  uint32_t group() const { return uint32_t(param(1)); }
  static Grouping Group(const Section& s) { return s.key ? Grouping::kPerChannel : Grouping::kPerToken; }
};

}  // namespace

std::unique_ptr<Codec> MakeKiviCodec() { return std::make_unique<KiviCodec>(); }

}  // namespace flatkv::codec
