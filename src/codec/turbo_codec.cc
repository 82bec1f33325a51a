// turbo: TurboQuant-style vector quantization (Zandieh et al., 2025). Each
// head vector is rotated by the randomized Hadamard transform of
// codec/rotation.h, which makes its coordinates close to i.i.d. Gaussian
// with variance |x|^2 / d; each rotated coordinate is then quantized with
// the Lloyd-Max codebook for a standard Gaussian (2, 3 or 4 bits), scaled
// by sigma = |x| / sqrt(d). What is stored per vector is not sigma itself
// but the least-squares scale alpha = <y, L> / <L, L> of the chosen levels
// L (for a Gaussian vector alpha ~ sigma, so it carries the norm, and it
// is the best scale for these codes).
//
// Body: u8 wide flag; per part: alpha [token][head] (f16, or f32 when
// wide), then each token's codes, `bits` per element LSB-first
// (ceil(width * bits / 8) bytes per token).
#include <algorithm>
#include <cmath>

#include "codec/codec_internal.h"
#include "codec/kernels.h"
#include "codec/rotation.h"

namespace flatkv::codec {
namespace {

// Lloyd-Max reconstruction levels for N(0, 1), positive half, ascending.
constexpr float kLevels2[] = {0.4528f, 1.5104f};
constexpr float kLevels3[] = {0.2451f, 0.7560f, 1.3440f, 2.1520f};
constexpr float kLevels4[] = {0.1284f, 0.3881f, 0.6568f, 0.9424f, 1.2562f, 1.6181f, 2.0690f, 2.7326f};

struct Codebook {
  float level[16];
  float threshold[15];  // midpoints
  int n;
};

Codebook MakeCodebook(int bits) {
  const float* half = bits == 2 ? kLevels2 : bits == 3 ? kLevels3 : kLevels4;
  const int m = 1 << (bits - 1);
  Codebook cb{};
  cb.n = 2 * m;
  for (int i = 0; i < m; ++i) {
    cb.level[m - 1 - i] = -half[i];
    cb.level[m + i] = half[i];
  }
  for (int i = 0; i + 1 < cb.n; ++i) cb.threshold[i] = 0.5f * (cb.level[i] + cb.level[i + 1]);
  return cb;
}

class TurboCodec final : public LossyCodec {
 public:
  TurboCodec()
      : LossyCodec({{"bits", "bits per element: 2, 3 or 4", 2, 4, 4, true},
                    {"block", "largest Hadamard block (a power of two dividing head_dim is used)", 1, 1024, 128, true},
                    {"seed", "seed of the random signs", 0, 2147483647, 1, true}}) {}
  std::string_view name() const override { return "turbo"; }
  uint8_t id() const override { return 4; }
  bool FixedSize() const override { return false; }
  bool Lossless() const override { return false; }

 protected:
  uint64_t BodyBound(const SliceLayout& layout) const override {
    uint64_t b = 1;
    for (const Section& s : SplitSlice(layout).part)
      b += uint64_t(s.rows) * ((s.head_dim ? s.width / s.head_dim : 0) * 4 + (uint64_t(s.width) * bits() + 7) / 8);
    return b;
  }

  bool EncodeFloats(CodecContext& ctx, const SliceLayout& layout, const float* x, ByteWriter& w) const override {
    const Kernels& k = ActiveKernels();
    const Codebook cb = MakeCodebook(bits());
    const Sections p = SplitSlice(layout);
    const bool wide = NeedsWideMeta(x, layout.Elements());
    if (!w.Put<uint8_t>(wide)) return false;
    for (int i = 0; i < 2; ++i) {
      const Section& s = p.part[i];
      if (s.rows == 0 || s.width == 0) continue;
      auto* signs = reinterpret_cast<float*>(ctx.Scratch(3, (s.width + 1) * sizeof(float)));
      auto* row = reinterpret_cast<float*>(ctx.Scratch(2, (s.width + 1) * sizeof(float)));
      auto* codes = reinterpret_cast<uint8_t*>(ctx.Scratch(1, uint64_t(s.rows) * s.width + 1));
      RotationSigns(seed(), i, s.head_dim, s.width, signs);
      const uint32_t b = RotationBlock(s.head_dim, block()), heads = s.width / s.head_dim;
      for (uint32_t r = 0; r < s.rows; ++r) {
        std::copy_n(x + s.At(r, 0), s.width, row);
        k.sign_fwht(row, signs, s.width, b, 1.0f / std::sqrt(float(b)));
        for (uint32_t h = 0; h < heads; ++h) {
          const float* v = row + h * s.head_dim;
          uint8_t* c = codes + uint64_t(r) * s.width + h * s.head_dim;
          double norm2 = 0;
          for (uint32_t j = 0; j < s.head_dim; ++j) norm2 += double(v[j]) * v[j];
          const float sigma = float(std::sqrt(norm2 / s.head_dim));
          const float inv = sigma > 0 && std::isfinite(sigma) ? 1.0f / sigma : 0.0f;
          double yl = 0, ll = 0;
          for (uint32_t j = 0; j < s.head_dim; ++j) {
            const float u = v[j] * inv;
            const int q = int(std::upper_bound(cb.threshold, cb.threshold + (cb.n - 1), u) - cb.threshold);
            c[j] = uint8_t(q);
            yl += double(v[j]) * cb.level[q];
            ll += double(cb.level[q]) * cb.level[q];
          }
          float alpha = RoundMeta(ll > 0 ? float(yl / ll) : 0.0f, wide);
          if (!std::isfinite(alpha)) alpha = 0;
          if (!PutMeta(w, alpha, wide)) return false;
        }
      }
      const uint64_t rb = (uint64_t(s.width) * bits() + 7) / 8;
      for (uint32_t r = 0; r < s.rows; ++r) {
        uint8_t* q = w.Reserve(rb);
        if (!q) return false;
        PackCodes(codes + uint64_t(r) * s.width, s.width, bits(), q);
      }
    }
    return true;
  }

  Status DecodeFloats(CodecContext& ctx, const SliceLayout& layout, ByteReader& r, float* y) const override {
    uint8_t wide = 0;
    if (!r.Get(wide) || wide > 1) return BodyCorrupt("turbo", "bad metadata flag");
    const Kernels& k = ActiveKernels();
    const Codebook cb = MakeCodebook(bits());
    const Sections p = SplitSlice(layout);
    for (int i = 0; i < 2; ++i) {
      const Section& s = p.part[i];
      if (s.rows == 0 || s.width == 0) continue;
      const uint32_t heads = s.width / s.head_dim;
      const uint64_t meta_bytes = uint64_t(s.rows) * heads * (wide ? 4 : 2);
      const uint64_t rb = (uint64_t(s.width) * bits() + 7) / 8;
      const uint8_t* m = r.Take(meta_bytes);
      const uint8_t* packed = m ? r.Take(rb * s.rows) : nullptr;
      if (!packed) return BodyCorrupt("turbo", "truncated body");
      ByteReader mr({reinterpret_cast<const std::byte*>(m), meta_bytes});
      auto* signs = reinterpret_cast<float*>(ctx.Scratch(3, (s.width + 1) * sizeof(float)));
      auto* codes = reinterpret_cast<uint8_t*>(ctx.Scratch(1, s.width + 1));
      RotationSigns(seed(), i, s.head_dim, s.width, signs);
      const uint32_t b = RotationBlock(s.head_dim, block());
      for (uint32_t row = 0; row < s.rows; ++row) {
        float* out = y + s.At(row, 0);
        UnpackCodes(packed + rb * row, bits(), 0, s.width, codes);
        for (uint32_t h = 0; h < heads; ++h) {
          float alpha = 0;
          GetMeta(mr, wide, alpha);
          float scaled[16];
          for (int q = 0; q < cb.n; ++q) scaled[q] = alpha * cb.level[q];
          const uint32_t c0 = h * s.head_dim;
          for (uint32_t j = 0; j < s.head_dim; ++j) out[c0 + j] = scaled[codes[c0 + j] & 15];
        }
        k.fwht_sign(out, signs, s.width, b, 1.0f / std::sqrt(float(b)));
      }
    }
    return Status::Ok();
  }

 private:
  int bits() const { return int(param(0)); }
  uint32_t block() const { return uint32_t(param(1)); }
  uint64_t seed() const { return uint64_t(param(2)); }
};

}  // namespace

std::unique_ptr<Codec> MakeTurboCodec() { return std::make_unique<TurboCodec>(); }

}  // namespace flatkv::codec
