// int8: symmetric absmax quantization per token per head (MHA: each K and
// V head vector; MLA: each token's latent and its RoPE key). Each vector
// stores scale = absmax / 127 (f16, or f32 when the slice needs it) and
// one byte per element, q + 128 with q = round(x / scale) in [-127, 127].
//
// Body: u8 wide flag; then per part (K then V, or latent then rope): all
// scales [token][head], then the codes [token][channel].
#include <algorithm>
#include <cmath>

#include "codec/codec_internal.h"
#include "codec/kernels.h"

namespace flatkv::codec {
namespace {

class Int8Codec final : public LossyCodec {
 public:
  Int8Codec() : LossyCodec(std::vector<CodecParamInfo>{}) {}
  std::string_view name() const override { return "int8"; }
  uint8_t id() const override { return 1; }
  bool FixedSize() const override { return false; }
  bool Lossless() const override { return false; }

 protected:
  uint64_t BodyBound(const SliceLayout& layout) const override {
    uint64_t b = 1;
    for (const Section& s : SplitSlice(layout).part) b += uint64_t(s.rows) * (Heads(s) * 4 + s.width);
    return b;
  }

  bool EncodeFloats(CodecContext&, const SliceLayout& layout, const float* x, ByteWriter& w) const override {
    const bool wide = NeedsWideMeta(x, layout.Elements());
    if (!w.Put<uint8_t>(wide)) return false;
    for (const Section& s : SplitSlice(layout).part) {
      for (uint32_t r = 0; r < s.rows; ++r)
        for (uint32_t h = 0; h < Heads(s); ++h) {
          if (!PutMeta(w, Scale(x + s.At(r, h * s.head_dim), s.head_dim, wide), wide)) return false;
        }
      for (uint32_t r = 0; r < s.rows; ++r) {
        uint8_t* p = w.Reserve(s.width);
        if (!p) return false;
        for (uint32_t h = 0; h < Heads(s); ++h) {
          const float* v = x + s.At(r, h * s.head_dim);
          const float scale = Scale(v, s.head_dim, wide);
          const float inv = scale > 0 ? 1.0f / scale : 0.0f;
          for (uint32_t i = 0; i < s.head_dim; ++i)
            p[h * s.head_dim + i] = uint8_t(QuantCode(v[i], -128.0f * scale, inv, 255));
        }
      }
    }
    return true;
  }

  Status DecodeFloats(CodecContext&, const SliceLayout& layout, ByteReader& r, float* y) const override {
    uint8_t wide = 0;
    if (!r.Get(wide) || wide > 1) return BodyCorrupt("int8", "bad metadata flag");
    const Kernels& k = ActiveKernels();
    for (const Section& s : SplitSlice(layout).part) {
      const uint64_t heads = Heads(s);
      const uint8_t* m = r.Take(uint64_t(s.rows) * heads * (wide ? 4 : 2));
      const uint8_t* codes = m ? r.Take(uint64_t(s.rows) * s.width) : nullptr;
      if (!codes) return BodyCorrupt("int8", "truncated body");
      ByteReader mr({reinterpret_cast<const std::byte*>(m), uint64_t(s.rows) * heads * (wide ? 4 : 2)});
      for (uint32_t row = 0; row < s.rows; ++row)
        for (uint32_t h = 0; h < heads; ++h) {
          float scale = 0;
          GetMeta(mr, wide, scale);
          k.dequant_scalar(codes + uint64_t(row) * s.width + h * s.head_dim, 8, 0, s.head_dim, -128.0f * scale, scale,
                           y + s.At(row, h * s.head_dim));
        }
    }
    return Status::Ok();
  }

 private:
  static uint32_t Heads(const Section& s) { return s.head_dim ? s.width / s.head_dim : 0; }
  static float Scale(const float* v, uint32_t n, bool wide) {
    float m = 0;
    for (uint32_t i = 0; i < n; ++i) m = std::max(m, std::fabs(v[i]));
    const float s = RoundMeta(m / 127.0f, wide);
    return std::isfinite(s) ? s : 0.0f;
  }
};

}  // namespace

std::unique_ptr<Codec> MakeInt8Codec() { return std::make_unique<Int8Codec>(); }

}  // namespace flatkv::codec
