// hadamard-int4: the randomized block-diagonal Hadamard rotation of
// codec/rotation.h (spreads outlier channels over their block), then
// token-wise symmetric INT4: each head vector's rotated elements in groups
// of `group`, scale = absmax / 7, codes q + 8 with q = round(x / scale) in
// [-7, 7], two per byte (low nibble first).
//
// Body: u8 wide flag; per part (K then V; MLA latent then rope): the
// scales [token][head][group] (f16, or f32 when wide), then each token's
// codes (ceil(width / 2) bytes).
#include <algorithm>
#include <cmath>

#include "codec/codec_internal.h"
#include "codec/kernels.h"
#include "codec/rotation.h"

namespace flatkv::codec {
namespace {

class HadamardCodec final : public LossyCodec {
 public:
  HadamardCodec()
      : LossyCodec({{"block", "largest Hadamard block (a power of two dividing head_dim is used)", 1, 1024, 128, true},
                    {"group", "elements per INT4 scale", 2, 1024, 32, true},
                    {"seed", "seed of the random signs", 0, 2147483647, 1, true}}) {}
  std::string_view name() const override { return "hadamard-int4"; }
  uint8_t id() const override { return 3; }
  bool FixedSize() const override { return false; }
  bool Lossless() const override { return false; }

 protected:
  uint64_t BodyBound(const SliceLayout& layout) const override {
    uint64_t b = 1;
    for (const Section& s : SplitSlice(layout).part) b += uint64_t(s.rows) * (Groups(s) * 4 + (s.width + 1) / 2);
    return b;
  }

  bool EncodeFloats(CodecContext& ctx, const SliceLayout& layout, const float* x, ByteWriter& w) const override {
    const Kernels& k = ActiveKernels();
    const uint64_t n = layout.Elements();
    auto* rot = reinterpret_cast<float*>(ctx.Scratch(2, n * sizeof(float)));
    const Sections p = SplitSlice(layout);
    uint64_t at = 0;
    for (int i = 0; i < 2; ++i) {
      const Section& s = p.part[i];
      auto* signs = reinterpret_cast<float*>(ctx.Scratch(3, (s.width + 1) * sizeof(float)));
      RotationSigns(seed(), i, s.head_dim, s.width, signs);
      const uint32_t b = RotationBlock(s.head_dim, block());
      for (uint32_t r = 0; r < s.rows; ++r, at += s.width) {
        std::copy_n(x + s.At(r, 0), s.width, rot + at);
        k.sign_fwht(rot + at, signs, s.width, b, 1.0f / std::sqrt(float(b)));
      }
    }
    const bool wide = NeedsWideMeta(rot, n);
    if (!w.Put<uint8_t>(wide)) return false;
    auto* codes = reinterpret_cast<uint8_t*>(ctx.Scratch(1, n + 1));
    at = 0;
    for (const Section& s : p.part) {
      const uint32_t heads = s.head_dim ? s.width / s.head_dim : 0;
      for (uint32_t r = 0; r < s.rows; ++r)
        for (uint32_t h = 0; h < heads; ++h)
          for (uint32_t g0 = 0; g0 < s.head_dim; g0 += group()) {
            const uint32_t len = std::min(group(), s.head_dim - g0);
            const uint64_t off = at + uint64_t(r) * s.width + h * s.head_dim + g0;
            float m = 0;
            for (uint32_t j = 0; j < len; ++j) m = std::max(m, std::fabs(rot[off + j]));
            float scale = RoundMeta(m / 7.0f, wide);
            if (!std::isfinite(scale)) scale = 0;
            if (!PutMeta(w, scale, wide)) return false;
            const float inv = scale > 0 ? 1.0f / scale : 0.0f;
            for (uint32_t j = 0; j < len; ++j)
              codes[off - at + j] = uint8_t(QuantCode(rot[off + j], -8.0f * scale, inv, 15));
          }
      const uint64_t rb = (s.width + 1) / 2;
      for (uint32_t r = 0; r < s.rows; ++r) {
        uint8_t* q = w.Reserve(rb);
        if (!q) return false;
        PackCodes(codes + uint64_t(r) * s.width, s.width, 4, q);
      }
      at += uint64_t(s.rows) * s.width;
    }
    return true;
  }

  Status DecodeFloats(CodecContext& ctx, const SliceLayout& layout, ByteReader& r, float* y) const override {
    uint8_t wide = 0;
    if (!r.Get(wide) || wide > 1) return BodyCorrupt("hadamard-int4", "bad metadata flag");
    const Kernels& k = ActiveKernels();
    const Sections p = SplitSlice(layout);
    for (int i = 0; i < 2; ++i) {
      const Section& s = p.part[i];
      if (s.rows == 0 || s.width == 0) continue;
      const uint64_t meta_bytes = uint64_t(s.rows) * Groups(s) * (wide ? 4 : 2), rb = (s.width + 1) / 2;
      const uint8_t* m = r.Take(meta_bytes);
      const uint8_t* codes = m ? r.Take(rb * s.rows) : nullptr;
      if (!codes) return BodyCorrupt("hadamard-int4", "truncated body");
      ByteReader mr({reinterpret_cast<const std::byte*>(m), meta_bytes});
      auto* signs = reinterpret_cast<float*>(ctx.Scratch(3, (s.width + 1) * sizeof(float)));
      RotationSigns(seed(), i, s.head_dim, s.width, signs);
      const uint32_t b = RotationBlock(s.head_dim, block());
      const uint32_t heads = s.width / s.head_dim;
      for (uint32_t row = 0; row < s.rows; ++row) {
        float* out = y + s.At(row, 0);
        for (uint32_t h = 0; h < heads; ++h)
          for (uint32_t g0 = 0; g0 < s.head_dim; g0 += group()) {
            float scale = 0;
            GetMeta(mr, wide, scale);
            const uint32_t c = h * s.head_dim + g0;
            k.dequant_scalar(codes + rb * row, 4, c, std::min(group(), s.head_dim - g0), -8.0f * scale, scale, out + c);
          }
        k.fwht_sign(out, signs, s.width, b, 1.0f / std::sqrt(float(b)));
      }
    }
    return Status::Ok();
  }

 private:
  uint32_t block() const { return uint32_t(param(0)); }
  uint32_t group() const { return uint32_t(param(1)); }
  uint64_t seed() const { return uint64_t(param(2)); }
  uint64_t Groups(const Section& s) const {
    if (!s.head_dim) return 0;
    return uint64_t(s.width / s.head_dim) * ((s.head_dim + group() - 1) / group());
  }
};

}  // namespace

std::unique_ptr<Codec> MakeHadamardCodec() { return std::make_unique<HadamardCodec>(); }

}  // namespace flatkv::codec
