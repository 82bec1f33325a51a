// pred: error-bounded predictive coding. Guarantees |x - x_hat| <= eps for
// every key element (MHA K, MLA rope key) and eps * v_eps_scale for every
// value element (MHA V, MLA latent), measured against the input's values
// in its own dtype (eps = 0: bit-exact).
//
// Each part of the slice (K and V; MLA latent and rope key) is coded row
// by row (token by token). A row's prediction P comes from the previous
// row's reconstruction (predictor=1; 0 predicts zero). On key parts with
// rope_theta > 0 the previous key is first rotated forward by one
// position at each RoPE frequency (channel pairs (2f, 2f+1) of a head by
// theta^(-2f/head_dim), the interleaved convention of src/model): that is
// predicting in the un-RoPE'd frame without needing absolute positions.
// The rotation coefficients are rounded to multiples of 2^-16 so that
// encoder and decoder agree across libm implementations.
//
// eps > 0: q = round((x - P) / (2 eps)), x_hat = dtype(P + q * 2eps) (f32
// arithmetic, no FMA); if |x - x_hat| > eps (rounding, overflow, NaN/Inf,
// |q| >= 2^30) the element is escaped and stored raw, so x_hat = x.
// eps = 0: the integer difference of the order-preserving integer images
// of x's bits and of dtype(P)'s bits, modulo 2^(bits of the dtype).
// Either way each element becomes an integer z >= 0 (zigzag) and a token
// byte: 0 = raw escape (value bytes in the extra stream), z + 1 when below
// 255, else 255 and varint(z + 1 - 255) in the extra stream.
//
// Body: u8 mode: 1 = the elements follow raw (when coding would be larger;
// MaxEncodedSize is therefore the raw size plus the header); 0 = per part: u8 coder (0 stored, 1 rANS (rans.h),
// 8 states, 2 zstd, 3 rANS with 32 states: parts of >= 16384 tokens), u32 length, the coded token bytes (rows * width of them);
// then the extra stream: u8 coder (0 stored, 2 zstd), u32 raw length,
// u32 coded length, the bytes. coder=0 (auto) keeps the smallest of rANS,
// zstd and stored per part.
#include <zstd.h>

#include <algorithm>
#include <cmath>

#include "codec/codec_internal.h"
#include "codec/dtype.h"
#include "codec/kernels.h"
#include "codec/rans.h"

namespace flatkv::codec {
namespace {

constexpr uint8_t kStored = 0, kRans = 1, kZstd = 2, kRans32 = 3;
// Parts of at least this many tokens are coded with 32 rANS states
// (kRans32: the AVX2 decoder's four independent vectors, about 3x the
// 8-state decoder's speed) for 96 more bytes of final states: at most
// 0.047 bits per element here, 0.012 on a 64-token Llama-3.1-8B slice part.
constexpr uint64_t kRansWideMinTokens = 16384;
constexpr uint8_t kCodedBody = 0, kRawBody = 1;

uint32_t Mono16(uint16_t u) { return (u & 0x8000u) ? uint16_t(~u) : uint16_t(u | 0x8000u); }
uint16_t Unmono16(uint32_t m) { return (m & 0x8000u) ? uint16_t(m & 0x7FFFu) : uint16_t(~m); }
uint32_t Mono32(uint32_t u) { return (u & 0x80000000u) ? ~u : (u | 0x80000000u); }
uint32_t Unmono32(uint32_t m) { return (m & 0x80000000u) ? (m & 0x7FFFFFFFu) : ~m; }

uint32_t ElementBits(DType dt, float v) {
  return dt == DType::kF32 ? FloatToBits(v) : dt == DType::kF16 ? FloatToHalf(v) : FloatToBf16(v);
}
float BitsToElement(DType dt, uint32_t b) {
  return dt == DType::kF32 ? BitsToFloat(b) : dt == DType::kF16 ? HalfToFloat(uint16_t(b)) : Bf16ToFloat(uint16_t(b));
}

void PutVarint(std::vector<uint8_t>& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(uint8_t(v | 0x80));
    v >>= 7;
  }
  out.push_back(uint8_t(v));
}

// Per-channel rotation for one step of RoPE over channel pairs (2i, 2i+1):
// P[c] = prev[c] * cs[c] + prev[c ^ 1] * sn[c] (kernels.h rope_predict).
struct RopeStep {
  std::vector<float> cs, sn;  // width entries; sn is -sin at even, +sin at odd channels
  bool on = false;
};

RopeStep ComputeRopeStep(const Section& s, double theta) {
  RopeStep r;
  if (!s.key || theta <= 0 || s.head_dim < 2 || s.head_dim % 2) return r;
  r.on = true;
  r.cs.resize(s.width);
  r.sn.resize(s.width);
  for (uint32_t c = 0; c < s.width; c += 2) {
    const double freq = std::pow(theta, -double(c % s.head_dim) / s.head_dim);
    r.cs[c] = r.cs[c + 1] = float(std::nearbyint(std::cos(freq) * 65536.0) / 65536.0);
    const float sn = float(std::nearbyint(std::sin(freq) * 65536.0) / 65536.0);
    r.sn[c] = -sn;
    r.sn[c + 1] = sn;
  }
  return r;
}

// ComputeRopeStep, remembered per thread for the last two (theta, width,
// head_dim) it was asked for (a slice's key part, and MLA's rope key): the
// table is a pure function of them, and its pow, cos and sin per channel pair
// cost about 5% of a Llama-3.1-8B slice's decode.
const RopeStep& MakeRopeStep(const Section& s, double theta) {
  struct Entry {
    double theta = -1;
    uint32_t width = 0, head_dim = 0;
    bool key = false;
    RopeStep step;
  };
  thread_local Entry memo[2];
  thread_local int next = 0;
  for (const Entry& e : memo)
    if (e.theta == theta && e.width == s.width && e.head_dim == s.head_dim && e.key == s.key) return e.step;
  Entry& e = memo[next];
  next ^= 1;
  e.step = ComputeRopeStep(s, theta);
  e.theta = theta, e.width = s.width, e.head_dim = s.head_dim, e.key = s.key;
  return e.step;
}

// The prediction row for row `t` from the reconstructed previous row.
void Predict(const Section& s, const float* y, uint32_t t, int predictor, const RopeStep& rope, const Kernels& k,
             float* pred) {
  if (t == 0 || predictor == 0) {
    std::fill_n(pred, s.width, 0.0f);
    return;
  }
  const float* prev = y + s.At(t - 1, 0);
  if (!rope.on) {
    std::copy_n(prev, s.width, pred);
    return;
  }
  k.rope_predict(prev, rope.cs.data(), rope.sn.data(), pred, s.width);
}

// predictor=2: head h (> 0) of row t is predicted as its previous-token
// prediction plus how far head h-1's reconstruction landed from its own:
// P2[c] = P[c] + (y[t][c - hd] - P[c - hd]); a NaN becomes 0.
void CrossHead(const float* pred, const float* row, uint32_t c0, uint32_t hd, float* p2) {
  for (uint32_t c = c0; c < c0 + hd; ++c) {
    const float p = pred[c] + (row[c - hd] - pred[c - hd]);
    p2[c] = p == p ? p : 0.0f;
  }
}

class PredCodec final : public LossyCodec {
 public:
  PredCodec()
      : LossyCodec(
            {{"eps", "absolute error bound per element (0 = lossless)", 0, 1e9, 0, false},
             {"predictor", "0 none, 1 previous token, 2 previous token + the previous head's change", 0, 2, 1, true},
             {"rope_theta", "RoPE base for key prediction (0 = off)", 0, 1e9, 0, false},
             {"coder", "0 auto (smallest), 1 rANS, 2 zstd, 3 stored", 0, 3, 0, true},
             {"zstd_level", "zstd level for coder 0/2", 1, 19, 3, true},
             {"v_eps_scale", "bound on values (MLA: latent) = eps * this", 1e-3, 1e6, 1, false}}) {}
  std::string_view name() const override { return "pred"; }
  uint8_t id() const override { return 5; }
  bool FixedSize() const override { return false; }
  bool Lossless() const override { return param(0) == 0; }

  // Bytes the last Encode's parts took with each coder (for benchmarks):
  // filled only when the caller passes a non-null pointer via SetStats.
  struct CoderSizes {
    uint64_t rans = 0, zstd = 0, stored = 0;
  };

 protected:
  // A coded body never exceeds the raw elements plus the mode byte: when
  // coding would be larger the slice is stored raw (mode 1).
  uint64_t BodyBound(const SliceLayout& layout) const override { return 1 + layout.Bytes(); }

  bool EncodeFloats(CodecContext& ctx, const SliceLayout& layout, const float* x, ByteWriter& body) const override {
    const uint64_t n = layout.Elements();
    // Code into a staging buffer big enough for the worst case (each part
    // as large as a forced rANS stream can be, every element escaped with a
    // 5-byte varint), then keep the coded body or, when it is larger, the
    // raw elements.
    const uint64_t staging = 1 + 2 * (5 + n + RansBound(n, kRansWide)) + 9 + 6 * n + 64;
    auto* stage = ctx.Scratch(4, staging);
    ByteWriter w({stage, staging});
    if (!EncodeCoded(ctx, layout, x, w)) return false;
    if (w.size() <= BodyBound(layout)) return body.Append(stage, w.size());
    uint8_t* raw = body.Put<uint8_t>(kRawBody) ? body.Reserve(layout.Bytes()) : nullptr;
    if (!raw) return false;
    FromFloat(layout.shape.dtype, x, reinterpret_cast<std::byte*>(raw), n);
    return true;
  }

  bool EncodeCoded(CodecContext& ctx, const SliceLayout& layout, const float* x, ByteWriter& w) const {
    const uint64_t n = layout.Elements();
    const DType dt = layout.shape.dtype;
    auto* y = reinterpret_cast<float*>(ctx.Scratch(1, n * sizeof(float) + 4));
    auto* tokens = reinterpret_cast<uint8_t*>(ctx.Scratch(2, n + 1));
    std::vector<uint8_t> extra;
    const Sections p = SplitSlice(layout);
    const Kernels& k = ActiveKernels();
    if (!w.Put<uint8_t>(kCodedBody)) return false;
    uint64_t tok_at = 0;
    const uint64_t coded_bytes = RansBound(n, kRansWide) + ZSTD_compressBound(n) + 64;
    uint8_t* coded = reinterpret_cast<uint8_t*>(ctx.Scratch(5, coded_bytes + RansBound(n, kRansWide) + 64));
    uint8_t* scratch = coded + coded_bytes;
    for (const Section& s : p.part) {
      const double eps = PartEps(s);
      const float step = float(2 * eps);
      const RopeStep& rope = MakeRopeStep(s, param(2));
      auto* pred = reinterpret_cast<float*>(ctx.Scratch(3, (s.width + 1) * sizeof(float)));
      auto* p2 = reinterpret_cast<float*>(ctx.Scratch(7, (s.width + 1) * sizeof(float)));
      uint8_t* tok = tokens + tok_at;
      for (uint32_t t = 0; t < s.rows; ++t) {
        Predict(s, y, t, int(param(1)), rope, k, pred);
        const bool cross = param(1) == 2;
        for (uint32_t c = 0; c < s.width; ++c) {
          const uint64_t at = s.At(t, c);
          const float v = x[at];
          if (cross && c >= s.head_dim && c % s.head_dim == 0) CrossHead(pred, y + s.At(t, 0), c, s.head_dim, p2);
          const float pc = cross && c >= s.head_dim ? p2[c] : pred[c];
          uint64_t z;
          bool raw = false;
          if (eps == 0) {
            const uint32_t pb = ElementBits(dt, pc), xb = ElementBits(dt, v);
            if (dt == DType::kF32) {
              const int32_t d = int32_t(Mono32(xb) - Mono32(pb));
              z = (uint32_t(d) << 1) ^ uint32_t(d >> 31);
            } else {
              const int16_t d = int16_t(uint16_t(Mono16(uint16_t(xb)) - Mono16(uint16_t(pb))));
              z = uint16_t((uint16_t(d) << 1) ^ uint16_t(d >> 15));
            }
            y[at] = v;
          } else {
            const double qd = std::nearbyint((double(v) - double(pc)) / double(step));
            raw = true;
            if (std::fabs(qd) < 1073741824.0) {
              const int32_t q = int32_t(qd);
              const float r = RoundToDType(dt, pc + float(q) * step);
              if (std::fabs(double(v) - double(r)) <= eps) {
                raw = false;
                y[at] = r;
                z = (uint32_t(q) << 1) ^ uint32_t(q >> 31);
              }
            }
            if (raw) {
              y[at] = v;
              const uint32_t b = ElementBits(dt, v);
              for (uint32_t i = 0; i < DTypeBytes(dt); ++i) extra.push_back(uint8_t(b >> (8 * i)));
              *tok++ = 0;
              continue;
            }
          }
          if (z + 1 < 255) {
            *tok++ = uint8_t(z + 1);
          } else {
            *tok++ = 255;
            PutVarint(extra, z + 1 - 255);
          }
        }
      }
      const uint64_t m = uint64_t(s.rows) * s.width;
      if (!WriteCoded(ctx, tokens + tok_at, m, coded, scratch, w)) return false;
      tok_at += m;
    }
    // The extra stream: zstd when it pays.
    size_t zlen = 0;
    uint8_t* z = reinterpret_cast<uint8_t*>(ctx.Scratch(6, ZSTD_compressBound(extra.size()) + 1));
    if (!extra.empty()) {
      zlen = ZSTD_compressCCtx(static_cast<ZSTD_CCtx*>(ContextAccess::ZstdCCtx(ctx)), z,
                               ZSTD_compressBound(extra.size()), extra.data(), extra.size(), int(param(4)));
      if (ZSTD_isError(zlen)) zlen = SIZE_MAX;
    }
    const bool use_z = !extra.empty() && zlen < extra.size();
    return w.Put<uint8_t>(use_z ? kZstd : kStored) && w.Put<uint32_t>(uint32_t(extra.size())) &&
           w.Put<uint32_t>(uint32_t(use_z ? zlen : extra.size())) &&
           w.Append(use_z ? z : extra.data(), use_z ? zlen : extra.size());
  }

  Status DecodeFloats(CodecContext& ctx, const SliceLayout& layout, ByteReader& r, float* y) const override {
    const uint64_t n = layout.Elements();
    const DType dt = layout.shape.dtype;
    uint8_t mode;
    if (!r.Get(mode) || (mode != kCodedBody && mode != kRawBody)) return BodyCorrupt("pred", "bad body mode");
    if (mode == kRawBody) {
      const uint8_t* raw = r.Take(layout.Bytes());
      if (!raw) return BodyCorrupt("pred", "truncated raw body");
      ToFloat(dt, reinterpret_cast<const std::byte*>(raw), y, n);
      return Status::Ok();
    }
    auto* tokens = reinterpret_cast<uint8_t*>(ctx.Scratch(2, n + 1));
    const Sections p = SplitSlice(layout);
    uint64_t tok_at = 0;
    for (const Section& s : p.part) {
      FLATKV_RETURN_IF_ERROR(ReadCoded(ctx, r, uint64_t(s.rows) * s.width, tokens + tok_at));
      tok_at += uint64_t(s.rows) * s.width;
    }
    uint8_t ecoder;
    uint32_t elen, eclen;
    if (!r.Get(ecoder) || !r.Get(elen) || !r.Get(eclen) || (ecoder != kStored && ecoder != kZstd) ||
        elen > 6 * n + 16 || (ecoder == kStored && eclen != elen))
      return BodyCorrupt("pred", "bad extra-stream header");
    const uint8_t* ebytes = r.Take(eclen);
    if (!ebytes) return BodyCorrupt("pred", "truncated extra stream");
    if (ecoder == kZstd) {
      auto* buf = reinterpret_cast<uint8_t*>(ctx.Scratch(6, elen + 1));
      const size_t got =
          ZSTD_decompressDCtx(static_cast<ZSTD_DCtx*>(ContextAccess::ZstdDCtx(ctx)), buf, elen, ebytes, eclen);
      if (ZSTD_isError(got) || got != elen) return BodyCorrupt("pred", "bad zstd extra stream");
      ebytes = buf;
    }
    const uint8_t* e = ebytes;
    const uint8_t* e_end = ebytes + elen;
    const uint32_t esize = DTypeBytes(dt);
    const Kernels& k = ActiveKernels();
    tok_at = 0;
    for (const Section& s : p.part) {
      const double eps = PartEps(s);
      const float step = float(2 * eps);
      const RopeStep& rope = MakeRopeStep(s, param(2));
      auto* pred = reinterpret_cast<float*>(ctx.Scratch(3, (s.width + 1) * sizeof(float)));
      auto* p2 = reinterpret_cast<float*>(ctx.Scratch(7, (s.width + 1) * sizeof(float)));
      const bool cross = param(1) == 2;
      const uint32_t seg = cross ? s.head_dim : s.width;
      const uint8_t* tok = tokens + tok_at;
      for (uint32_t t = 0; t < s.rows; ++t) {
        Predict(s, y, t, int(param(1)), rope, k, pred);
        float* out = y + s.At(t, 0);
        for (uint32_t c0 = 0; c0 < s.width; c0 += seg) {
          const float* P = pred;
          if (cross && c0 > 0) {
            CrossHead(pred, out, c0, s.head_dim, p2);
            P = p2;
          }
          for (uint32_t c = c0; c < c0 + seg; ++c) {
            if (eps > 0) {  // the fast path takes the plain tokens
              const size_t done = k.pred_reconstruct(tok, P + c, out + c, c0 + seg - c, step, int(dt));
              tok += done;
              c += uint32_t(done);
              if (c == c0 + seg) break;
            }
            const uint8_t b = *tok++;
            uint64_t z;
            if (b == 0) {
              if (eps == 0 || size_t(e_end - e) < esize) return BodyCorrupt("pred", "bad raw escape");
              uint32_t bits = 0;
              for (uint32_t i = 0; i < esize; ++i) bits |= uint32_t(e[i]) << (8 * i);
              e += esize;
              out[c] = BitsToElement(dt, bits);
              continue;
            }
            if (b < 255) {
              z = b - 1;
            } else {
              uint64_t v = 0;
              int shift = 0;
              for (;;) {
                if (e == e_end || shift > 35) return BodyCorrupt("pred", "bad varint in extra stream");
                const uint8_t byte = *e++;
                v |= uint64_t(byte & 0x7F) << shift;
                shift += 7;
                if (!(byte & 0x80)) break;
              }
              z = v + 254;
            }
            if (eps == 0) {
              const uint32_t pb = ElementBits(dt, P[c]);
              if (dt == DType::kF32) {
                const uint32_t d = uint32_t(z >> 1) ^ (0u - uint32_t(z & 1));
                out[c] = BitsToFloat(Unmono32(Mono32(pb) + d));
              } else {
                const uint16_t d = uint16_t(uint16_t(z >> 1) ^ uint16_t(0u - uint32_t(z & 1)));
                out[c] = BitsToElement(dt, Unmono16(uint16_t(Mono16(uint16_t(pb)) + d)));
              }
            } else {
              const int32_t q = int32_t(uint32_t(z >> 1) ^ (0u - uint32_t(z & 1)));
              out[c] = RoundToDType(dt, P[c] + float(q) * step);
            }
          }
        }
      }
      tok_at += uint64_t(s.rows) * s.width;
    }
    if (e != e_end) return BodyCorrupt("pred", std::to_string(e_end - e) + " unused extra-stream bytes");
    return Status::Ok();
  }

 private:
  double PartEps(const Section& s) const { return s.key ? param(0) : param(0) * param(5); }

  bool WriteCoded(CodecContext& ctx, const uint8_t* tok, uint64_t m, uint8_t* coded, uint8_t* scratch,
                  ByteWriter& w) const {
    const int coder = int(param(3));
    size_t rans = SIZE_MAX, zs = SIZE_MAX;
    const bool wide = m >= kRansWideMinTokens;
    const uint8_t rans_id = wide ? kRans32 : kRans;
    uint8_t* rans_out = coded;
    uint8_t* zstd_out = coded + RansBound(m, kRansWide) + 32;
    if (m && (coder == 0 || coder == 1)) {
      const int states = wide ? kRansWide : kRansNarrow;
      rans = RansEncode(tok, m, rans_out, RansBound(m, states) + 32, scratch, states);
      if (rans == 0) rans = SIZE_MAX;
    }
    if (m && (coder == 0 || coder == 2)) {
      zs = ZSTD_compressCCtx(static_cast<ZSTD_CCtx*>(ContextAccess::ZstdCCtx(ctx)), zstd_out, ZSTD_compressBound(m),
                             tok, m, int(param(4)));
      if (ZSTD_isError(zs)) zs = SIZE_MAX;
    }
    uint8_t which = kStored;
    size_t len = m;
    const uint8_t* src = tok;
    if (rans <= len && (coder == 0 || coder == 1)) which = rans_id, len = rans, src = rans_out;
    if (zs < len || (coder == 2 && zs != SIZE_MAX)) which = kZstd, len = zs, src = zstd_out;
    if (coder == 1 && rans != SIZE_MAX) which = rans_id, len = rans, src = rans_out;
    return w.Put<uint8_t>(which) && w.Put<uint32_t>(uint32_t(len)) && w.Append(src, len);
  }

  Status ReadCoded(CodecContext& ctx, ByteReader& r, uint64_t m, uint8_t* out) const {
    uint8_t which;
    uint32_t len;
    if (!r.Get(which) || !r.Get(len)) return BodyCorrupt("pred", "truncated part header");
    const uint8_t* src = r.Take(len);
    if (!src) return BodyCorrupt("pred", "part of " + std::to_string(len) + " bytes is truncated");
    switch (which) {
      case kStored:
        if (len != m)
          return BodyCorrupt("pred", "stored part of " + std::to_string(len) + " bytes, expected " + std::to_string(m));
        if (m) std::memcpy(out, src, m);
        return Status::Ok();
      case kRans:
        if (!RansDecode(src, len, out, m, kRansNarrow)) return BodyCorrupt("pred", "bad rANS stream");
        return Status::Ok();
      case kRans32:
        if (!RansDecode(src, len, out, m, kRansWide)) return BodyCorrupt("pred", "bad 32-state rANS stream");
        return Status::Ok();
      case kZstd: {
        const size_t got = ZSTD_decompressDCtx(static_cast<ZSTD_DCtx*>(ContextAccess::ZstdDCtx(ctx)), out, m, src, len);
        if (ZSTD_isError(got) || got != m) return BodyCorrupt("pred", "bad zstd part");
        return Status::Ok();
      }
      default:
        return BodyCorrupt("pred", "unknown coder " + std::to_string(which));
    }
  }
};

}  // namespace

std::unique_ptr<Codec> MakePredCodec() { return std::make_unique<PredCodec>(); }

}  // namespace flatkv::codec
