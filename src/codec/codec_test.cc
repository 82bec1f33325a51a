// Round trips, error bounds and malformed input for every codec.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "codec/codec_internal.h"
#include "codec/dtype.h"
#include "codec/synthetic_kv.h"

namespace flatkv::codec {
namespace {

SliceLayout Mha(uint32_t heads, uint32_t dim, DType dt, uint32_t tokens, uint32_t first = 0) {
  SliceLayout l;
  l.shape = KvShape::Mha(2, heads, dim, dt);
  l.tokens = tokens;
  l.first_position = first;
  l.layer = 1;
  return l;
}
SliceLayout Mla(uint32_t latent, uint32_t rope, DType dt, uint32_t tokens) {
  SliceLayout l;
  l.shape = KvShape::Mla(2, latent, rope, dt);
  l.tokens = tokens;
  return l;
}

std::vector<SliceLayout> Layouts() {
  std::vector<SliceLayout> out;
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    out.push_back(Mha(4, 8, dt, 16));     // stories260K
    out.push_back(Mha(4, 8, dt, 13, 5));  // odd tokens
    out.push_back(Mla(64, 16, dt, 16));
  }
  out.push_back(Mha(8, 128, DType::kBF16, 16, 64));  // Llama-3.1-8B
  out.push_back(Mha(2, 128, DType::kF16, 64));
  out.push_back(Mha(3, 6, DType::kF32, 7));  // awkward: non-power-of-two head_dim
  return out;
}

std::vector<float> Floats(const SliceLayout& l, std::span<const std::byte> b) {
  std::vector<float> f(l.Elements());
  ToFloat(l.shape.dtype, b.data(), f.data(), f.size());
  return f;
}

struct Roundtrip {
  std::vector<std::byte> in, enc, out;
  size_t size = 0;
};

Roundtrip RunCodec(const Codec& c, const SliceLayout& l, uint64_t seed) {
  Roundtrip r;
  r.in.resize(l.Bytes());
  FillSyntheticKv(l, seed, r.in);
  r.enc.resize(c.MaxEncodedSize(l));
  CodecContext ctx;
  auto n = c.Encode(ctx, l, r.in, r.enc);
  EXPECT_TRUE(n.ok()) << c.Spec() << ": " << n.status().ToString();
  if (!n.ok()) return r;
  r.size = *n;
  EXPECT_LE(r.size, c.MaxEncodedSize(l));
  if (c.FixedSize()) {
    EXPECT_EQ(r.size, c.MaxEncodedSize(l));
  }
  r.enc.resize(r.size);
  r.out.resize(l.Bytes());
  Status st = DecodeSlice(ctx, l, r.enc, r.out);
  EXPECT_TRUE(st.ok()) << c.Spec() << ": " << st.ToString();
  return r;
}

double RelMse(const SliceLayout& l, const Roundtrip& r) {
  const auto a = Floats(l, r.in), b = Floats(l, r.out);
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(a[i]) * a[i];
  }
  return num / std::max(den, 1e-30);
}

TEST(Codec, RegistryNamesAndIdsAreStable) {
  EXPECT_EQ(CodecNames(), (std::vector<std::string>{"raw", "int8", "kivi", "hadamard-int4", "turbo", "pred", "mla"}));
  for (const auto& f : Registry()) EXPECT_EQ(f.make()->id(), f.id) << f.name;
}

TEST(Codec, LosslessRoundTripsAreBitExact) {
  for (const char* spec : {"raw", "raw:dtype=3", "pred", "pred:rope_theta=10000", "pred:coder=1", "pred:coder=2",
                           "pred:coder=3", "pred:predictor=0", "pred:predictor=2,rope_theta=10000"}) {
    auto c = MakeCodec(spec);
    ASSERT_TRUE(c.ok()) << spec;
    ASSERT_TRUE((*c)->Lossless());
    for (const SliceLayout& l : Layouts()) {
      const Roundtrip r = RunCodec(**c, l, 11);
      EXPECT_EQ(r.in, r.out) << spec << " " << l.shape.ToString() << " tokens " << l.tokens;
    }
  }
}

TEST(Codec, LossyRoundTripsStayWithinTheirErrorBudget) {
  const std::vector<std::pair<std::string, double>> cases = {{"raw:dtype=2", 1e-4},
                                                             {"raw:dtype=1", 1e-5},
                                                             {"int8", 1e-3},
                                                             {"kivi:bits=4", 0.02},
                                                             {"kivi:bits=2", 0.3},
                                                             {"hadamard-int4", 0.02},
                                                             {"turbo:bits=4", 0.02},
                                                             {"turbo:bits=3", 0.06},
                                                             {"turbo:bits=2", 0.2},
                                                             {"mla", 0.02},
                                                             {"mla:latent_bits=3,rope_bits=5", 0.06},
                                                             {"pred:eps=0.01", 1e-3}};
  for (const auto& [spec, bound] : cases) {
    auto c = MakeCodec(spec);
    ASSERT_TRUE(c.ok()) << spec;
    for (const SliceLayout& l : Layouts()) {
      if (!(*c)->Supports(l).ok()) {
        EXPECT_EQ(l.shape.kind, AttentionKind::kMha) << spec;  // only mla refuses, and only MHA
        continue;
      }
      const Roundtrip r = RunCodec(**c, l, 5);
      EXPECT_LT(RelMse(l, r), bound) << spec << " " << l.shape.ToString() << " tokens " << l.tokens;
    }
  }
}

TEST(Codec, LossyCodecsShrinkTheSlice) {
  const SliceLayout l = Mha(8, 128, DType::kBF16, 16);
  for (const auto& [spec, max_bits] : std::vector<std::pair<std::string, double>>{
           {"int8", 8.3}, {"kivi:bits=4", 5.6}, {"kivi:bits=2", 3.6}, {"hadamard-int4", 4.6}, {"turbo:bits=3", 3.2}}) {
    auto c = MakeCodec(spec);
    const Roundtrip r = RunCodec(**c, l, 2);
    EXPECT_LT(8.0 * r.size / l.Elements(), max_bits) << spec;
  }
}

// Data that stresses the bound: random magnitudes over many decades,
// subnormals, exact ties, infinities and NaNs.
std::vector<std::byte> NastyData(const SliceLayout& l, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> f(l.Elements());
  for (size_t i = 0; i < f.size(); ++i) {
    const uint64_t r = rng();
    switch (r % 8) {
      case 0:
        f[i] = std::ldexp(float(int32_t(r >> 32)) / 2147483648.0f, int((r >> 8) % 60) - 30);
        break;
      case 1:
        f[i] = float(int((r >> 8) % 64) - 32) * 0.005f;
        break;  // ties at eps multiples
      case 2:
        f[i] = BitsToFloat(uint32_t(r >> 16));
        break;  // anything, incl. NaN/Inf
      case 3:
        f[i] = 1e-40f * float((r >> 8) % 7);
        break;  // subnormal
      default:
        f[i] = (i > 0 ? f[i - 1] : 0.0f) + float(int32_t(r >> 40)) * 1e-9f;
    }
  }
  std::vector<std::byte> b(l.Bytes());
  FromFloat(l.shape.dtype, f.data(), b.data(), f.size());
  return b;
}

TEST(Codec, PredHoldsItsErrorBoundOnEveryElement) {
  for (double eps : {0.0, 1e-6, 0.01, 2.0}) {
    for (const char* extra : {"", ",rope_theta=500000", ",predictor=0", ",predictor=2", ",v_eps_scale=4"}) {
      auto c = MakeCodec("pred:eps=" + std::to_string(eps) + extra);
      ASSERT_TRUE(c.ok());
      for (const SliceLayout& l : Layouts()) {
        if (l.shape.head_dim == 128 && *extra) continue;  // the big layouts once per eps
        for (int data = 0; data < 2; ++data) {
          std::vector<std::byte> in = data ? NastyData(l, 3) : std::vector<std::byte>(l.Bytes());
          if (!data) FillSyntheticKv(l, 9, in);
          std::vector<std::byte> enc((*c)->MaxEncodedSize(l)), out(l.Bytes());
          CodecContext ctx;
          auto n = (*c)->Encode(ctx, l, in, enc);
          ASSERT_TRUE(n.ok()) << n.status().ToString();
          ASSERT_TRUE(DecodeSlice(ctx, l, std::span(enc).first(*n), out).ok());
          if (eps == 0) {
            ASSERT_EQ(in, out) << l.shape.ToString();
            continue;
          }
          const auto a = Floats(l, in), b = Floats(l, out);
          const double v_scale = std::string(extra) == ",v_eps_scale=4" ? 4 : 1;
          const Sections parts = SplitSlice(l);
          for (size_t i = 0; i < a.size(); ++i) {
            bool key = l.shape.kind == AttentionKind::kMha ? i < parts.part[1].base
                                                           : (i % parts.part[0].row_stride) >= parts.part[1].base;
            const double bound = key ? eps : eps * v_scale;
            if (std::isnan(a[i])) {
              ASSERT_TRUE(std::isnan(b[i]));
              continue;
            }
            ASSERT_TRUE(a[i] == b[i] || std::fabs(double(a[i]) - double(b[i])) <= bound)
                << "eps " << eps << extra << " " << l.shape.ToString() << " element " << i << ": " << a[i] << " -> "
                << b[i];
          }
        }
      }
    }
  }
}

TEST(Codec, EmptyPartsAndSlicesRoundTrip) {
  for (const char* spec :
       {"raw", "raw:dtype=2", "int8", "kivi", "hadamard-int4", "turbo:bits=3", "pred", "pred:eps=0.1", "mla"}) {
    auto c = MakeCodec(spec);
    for (const SliceLayout& l : {Mla(16, 0, DType::kBF16, 5), Mha(2, 8, DType::kF16, 0), Mla(8, 4, DType::kF32, 0)}) {
      if (!(*c)->Supports(l).ok()) continue;
      const Roundtrip r = RunCodec(**c, l, 3);
      if ((*c)->Lossless()) {
        EXPECT_EQ(r.in, r.out) << spec;
      }
    }
  }
}

TEST(Codec, PredStoresIncompressibleSlicesRaw) {
  for (const SliceLayout& l : {Mha(2, 8, DType::kF32, 16), Mla(16, 8, DType::kF32, 1)})
    for (const char* spec : {"pred", "pred:eps=1e-30", "pred:coder=1", "pred:coder=2"}) {
      std::vector<std::byte> in(l.Bytes());
      std::mt19937_64 rng(1);
      for (auto& b : in) b = std::byte(rng());
      auto c = MakeCodec(spec);
      std::vector<std::byte> enc((*c)->MaxEncodedSize(l)), out(l.Bytes());
      CodecContext ctx;
      auto n = (*c)->Encode(ctx, l, in, enc);
      ASSERT_TRUE(n.ok()) << n.status().ToString();
      EXPECT_EQ(*n, (*c)->MaxEncodedSize(l)) << spec;  // the raw body: mode byte + elements
      ASSERT_TRUE(DecodeSlice(ctx, l, std::span(enc).first(*n), out).ok());
      EXPECT_EQ(in, out) << spec;
    }
}

TEST(Codec, SpecsAndParameterErrors) {
  EXPECT_FALSE(MakeCodec("zip").ok());
  EXPECT_NE(MakeCodec("zip").status().message().find("known: raw"), std::string::npos);
  EXPECT_FALSE(MakeCodec("kivi:bits=5").ok());
  EXPECT_FALSE(MakeCodec("kivi:bits=2.5").ok());
  EXPECT_FALSE(MakeCodec("kivi:nope=1").ok());
  EXPECT_FALSE(MakeCodec("kivi:bits").ok());
  EXPECT_FALSE(MakeCodec("kivi:bits=x").ok());
  EXPECT_FALSE(MakeCodec("pred:eps=-1").ok());
  auto k3 = MakeCodec("kivi:bits=3");
  ASSERT_TRUE(k3.ok());
  EXPECT_FALSE((*k3)->Supports(Mha(4, 8, DType::kF32, 4)).ok());
  EXPECT_FALSE((*MakeCodec("mla"))->Supports(Mha(4, 8, DType::kF32, 4)).ok());
  auto c = MakeCodec("pred:eps=0.5,coder=2");
  ASSERT_TRUE(c.ok());
  auto again = MakeCodec((*c)->Spec());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->Spec(), (*c)->Spec());
  // Encode argument errors.
  const SliceLayout l = Mha(4, 8, DType::kF32, 4);
  std::vector<std::byte> in(l.Bytes()), out((*c)->MaxEncodedSize(l));
  CodecContext ctx;
  EXPECT_FALSE((*c)->Encode(ctx, l, std::span(in).first(3), out).ok());
  EXPECT_FALSE((*c)->Encode(ctx, l, in, std::span(out).first(10)).ok());
}

// An engine's fp8 KV cache (vLLM's --kv-cache-dtype fp8) is bytes to flatkv: raw keeps them bit for
// bit; every codec that computes on floats refuses them, naming itself and the dtype.
TEST(Codec, Fp8IsKeptAsItsBytesAndFloatCodecsRefuseItByName) {
  std::mt19937_64 rng(7);
  for (DType dt : {DType::kF8E4M3, DType::kF8E5M2}) {
    const std::string name(DTypeName(dt));
    for (const SliceLayout& l : {Mha(4, 8, dt, 16), Mha(1, 64, dt, 13, 5), Mla(64, 16, dt, 16)}) {
      EXPECT_EQ(l.Bytes(), l.Elements()) << name;
      auto raw = MakeCodec("raw");
      ASSERT_TRUE(raw.ok());
      ASSERT_TRUE((*raw)->Supports(l).ok()) << name;
      std::vector<std::byte> in(l.Bytes()), enc((*raw)->MaxEncodedSize(l)), out(l.Bytes());
      for (std::byte& b : in) b = std::byte(rng());  // every bit pattern, NaNs included
      CodecContext ctx;
      auto n = (*raw)->Encode(ctx, l, in, enc);
      ASSERT_TRUE(n.ok()) << n.status().ToString();
      ASSERT_TRUE(DecodeSlice(ctx, l, std::span(enc).first(*n), out).ok());
      EXPECT_EQ(in, out) << name;
      for (const char* spec : {"raw:dtype=1", "raw:dtype=2", "raw:dtype=3", "int8", "kivi", "hadamard-int4",
                               "turbo", "pred", "pred:eps=0.01", "mla"}) {
        auto c = MakeCodec(spec);
        ASSERT_TRUE(c.ok()) << spec;
        const Status st = (*c)->Supports(l);
        EXPECT_FALSE(st.ok()) << spec << " " << name;
        EXPECT_NE(st.message().find(name), std::string::npos) << st.ToString();
        EXPECT_NE(st.message().find((*c)->name()), std::string::npos) << st.ToString();
        EXPECT_FALSE((*c)->Encode(ctx, l, in, enc).ok()) << spec;
      }
    }
  }
}

TEST(Codec, DecodeSliceChecksTheHeader) {
  auto c = MakeCodec("kivi");
  const SliceLayout l = Mha(4, 8, DType::kBF16, 16);
  Roundtrip r = RunCodec(**c, l, 1);
  CodecContext ctx;
  std::vector<std::byte> out(l.Bytes());
  for (SliceLayout other : {Mha(4, 8, DType::kF16, 16), Mha(4, 8, DType::kBF16, 15), Mha(2, 8, DType::kBF16, 16),
                            Mha(4, 16, DType::kBF16, 16)}) {
    out.resize(other.Bytes());
    Status st = DecodeSlice(ctx, other, r.enc, out);
    EXPECT_EQ(st.code(), Code::kCorruption) << st.ToString();
  }
  out.resize(l.Bytes());
  auto bad = r.enc;
  bad[0] = std::byte{0};  // magic
  EXPECT_EQ(DecodeSlice(ctx, l, bad, out).code(), Code::kCorruption);
  bad = r.enc;
  bad[5] = std::byte{99};  // codec id
  EXPECT_EQ(DecodeSlice(ctx, l, bad, out).code(), Code::kCorruption);
  bad = r.enc;
  const double nine = 9;  // bits=9 out of range
  std::memcpy(bad.data() + kHeaderBytes, &nine, 8);
  EXPECT_EQ(DecodeSlice(ctx, l, bad, out).code(), Code::kCorruption);
  // The context caches decoders per parameter set; both still decode.
  auto c2 = MakeCodec("kivi:bits=2");
  Roundtrip r2 = RunCodec(**c2, l, 1);
  std::vector<std::byte> o1(l.Bytes()), o2(l.Bytes());
  ASSERT_TRUE(DecodeSlice(ctx, l, r.enc, o1).ok());
  ASSERT_TRUE(DecodeSlice(ctx, l, r2.enc, o2).ok());
  EXPECT_EQ(o1, r.out);
  EXPECT_EQ(o2, r2.out);
}

TEST(Codec, TruncatedAndDamagedSlicesAreRejectedWithoutCrashing) {
  const std::vector<std::string> specs = {"raw",           "raw:dtype=1",  "int8", "kivi:bits=2",
                                          "hadamard-int4", "turbo:bits=3", "pred", "pred:eps=0.01",
                                          "pred:coder=1",  "mla"};
  for (const auto& spec : specs) {
    auto c = MakeCodec(spec);
    const SliceLayout l = spec == "mla" ? Mla(16, 8, DType::kBF16, 5) : Mha(2, 8, DType::kBF16, 5);
    Roundtrip r = RunCodec(**c, l, 4);
    CodecContext ctx;
    std::vector<std::byte> out(l.Bytes());
    for (size_t len = 0; len < r.enc.size(); ++len)
      EXPECT_FALSE(DecodeSlice(ctx, l, std::span(r.enc).first(len), out).ok()) << spec << " len " << len;
    std::mt19937 rng(7);
    for (int i = 0; i < 300; ++i) {
      auto bad = r.enc;
      const size_t at = kHeaderBytes + rng() % (bad.size() - kHeaderBytes);
      bad[at] ^= std::byte(1 + rng() % 255);
      (void)DecodeSlice(ctx, l, bad, out);  // may succeed (lossy bodies); must not crash
    }
  }
}

}  // namespace
}  // namespace flatkv::codec

namespace flatkv::codec {
namespace {

// The encodings of a fixed slice, as FNV-1a hashes: any change to a body
// layout (docs/format_codec.md) shows here, and must bump the version.
// The data is exact in every dtype and needs no libm, so the hashes do not
// depend on the machine.
TEST(Codec, GoldenEncodingsAreStable) {
  // pred only with the rANS coder: zstd's output may change between
  // library versions (the test checks no zstd stream is involved).
  const std::vector<std::pair<std::string, uint64_t>> golden = {
      {"raw", 0xb9e3a57b954969b2ull},          {"raw:dtype=1", 0xc2cc856a3e3e487dull},
      {"int8", 0xe6a22adb7a2ed89bull},         {"kivi:bits=2", 0x65b726d8fd880040ull},
      {"kivi:bits=4", 0xb859dbfff75b3da8ull},  {"hadamard-int4", 0xa3c9b76a48bb4dedull},
      {"turbo:bits=3", 0xa242acf1c1b30e47ull}, {"pred:eps=0.05,coder=1", 0x6ba33806884e6bb3ull}};
  const SliceLayout l = Mha(2, 16, DType::kBF16, 40);
  std::vector<float> f(l.Elements());
  for (size_t i = 0; i < f.size(); ++i) f[i] = float(int((i * 37 + i / 64 * 5) % 101) - 50) / 16.0f;
  std::vector<std::byte> in(l.Bytes());
  FromFloat(l.shape.dtype, f.data(), in.data(), f.size());
  std::string actual;
  bool same = true;
  for (const auto& [spec, want] : golden) {
    auto c = MakeCodec(spec);
    std::vector<std::byte> enc((*c)->MaxEncodedSize(l));
    CodecContext ctx;
    const size_t n = *(*c)->Encode(ctx, l, in, enc);
    if ((*c)->name() == "pred") {  // a different zstd level must not change a byte
      auto other = MakeCodec(spec + ",zstd_level=19");
      std::vector<std::byte> enc2((*other)->MaxEncodedSize(l));
      const size_t n2 = *(*other)->Encode(ctx, l, in, enc2);
      const size_t params = kHeaderBytes + 8 * (*c)->Params().size();
      ASSERT_EQ(n, n2) << spec;
      EXPECT_EQ(0, std::memcmp(enc.data() + params, enc2.data() + params, n - params)) << spec;
    }
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; ++i) h = (h ^ uint64_t(enc[i])) * 0x100000001b3ull;
    char buf[64];
    std::snprintf(buf, sizeof buf, "0x%016llxull", static_cast<unsigned long long>(h));
    actual += "{\"" + spec + "\", " + buf + "}, ";
    same = same && h == want;
  }
  EXPECT_TRUE(same) << "encodings changed; if on purpose, bump the format version and update: " << actual;
}

}  // namespace
}  // namespace flatkv::codec
