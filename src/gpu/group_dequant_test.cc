// gpu/group_dequant.h, the arithmetic of the CUDA int8 and kivi decoders,
// compiled for the host: every element of a slice, converted to the slice's
// dtype by the same StoreElement the kernels call, equals the CPU codec's
// decode bit for bit, on slices of awkward sizes (1 to 333 tokens, head dims
// 8 to 128, MLA), kivi's two bit widths, groups that do not divide the rows
// or channels, f32, f16 and bf16, and f16 and f32 (wide) metadata. The
// conversions equal the CPU's on every class of float (NaNs, infinities,
// subnormals, halfway cases). ParseSlice refuses what is not its codec's
// slice, by name.
#include "gpu/group_dequant.h"

#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <vector>

#include "codec/codec_internal.h"
#include "codec/dtype.h"
#include "testing/test_util.h"

namespace flatkv::gpu {
namespace {

// Decodes `enc` element by element with gpu/group_dequant.h, as the kernels
// do (one thread an element), into `out` (dtype bytes).
template <typename ParsedSlice>
void DecodeParts(const SliceLayout& layout, std::span<const std::byte> enc, const ParsedSlice& s, std::vector<std::byte>& out) {
  const uint8_t* body = reinterpret_cast<const uint8_t*>(enc.data() + s.body);
  for (uint32_t k = 0; k < s.parts; ++k) {
    const auto& p = s.part[k];
    for (uint32_t row = 0; row < p.rows; ++row)
      for (uint32_t c = 0; c < p.width; ++c)
        StoreElement(int(layout.shape.dtype), Element(body, p, s.wide, row, c),  // int8:: or kivi:: by the part's type
                     out.data(), p.base + uint64_t(row) * p.row_stride + c);
  }
}

// Every slice of `specs` on the awkward shapes, decoded element by element,
// equals the CPU codec's decode; returns the slices checked.
int ExpectElementsEqualTheCpuCodec(const std::vector<std::string>& specs, bool kivi) {
  std::mt19937 rng(3);
  int cases = 0;
  for (const std::string& spec : specs) {
    auto codec = MakeCodec(spec);
    EXPECT_TRUE(codec.ok()) << spec << ": " << codec.status().ToString();
    if (!codec.ok()) return cases;
    for (DType dt : {DType::kF32, DType::kF16, DType::kBF16})
      for (uint32_t tokens : {1u, 17u, 64u, 333u})
        for (const KvShape& shape : {KvShape::Mha(2, 1, 8, dt), KvShape::Mha(2, 3, 64, dt), KvShape::Mha(2, 5, 72, dt),
                                     KvShape::Mha(2, 8, 128, dt), KvShape::Mla(2, 96, 16, dt), KvShape::Mla(2, 64, 0, dt)})
          for (float scale : {1.0f, 1e6f}) {  // 1e6: past f16's range, so the metadata is f32 (wide)
            const SliceLayout layout{shape, tokens, 1, 0};
            const testing::CodedSlice slice = testing::EncodeKvSlice(**codec, layout, rng, scale);
            EXPECT_FALSE(slice.decoded.empty());
            std::vector<std::byte> got(layout.Bytes(), std::byte{0xEE});
            Status parsed;
            if (kivi) {
              auto s = kivi::ParseSlice(layout, slice.encoded);
              if (s.ok()) DecodeParts(layout, slice.encoded, *s, got);
              parsed = s.status();
            } else {
              auto s = int8::ParseSlice(layout, slice.encoded);
              if (s.ok()) DecodeParts(layout, slice.encoded, *s, got);
              parsed = s.status();
            }
            EXPECT_TRUE(parsed.ok()) << spec << ": " << parsed.ToString();
            if (!parsed.ok()) return cases;
            EXPECT_EQ(std::memcmp(got.data(), slice.decoded.data(), got.size()), 0)
                << spec << " dtype " << int(dt) << " tokens " << tokens << " dims " << shape.kv_heads << "x" << shape.head_dim
                << " mla " << (shape.kind == AttentionKind::kMla) << " scale " << scale;
            ++cases;
          }
  }
  return cases;
}

TEST(KiviElementTest, EqualsTheCpuCodecBitForBit) {
  EXPECT_EQ(ExpectElementsEqualTheCpuCodec({"kivi:bits=2,group=32", "kivi:bits=4,group=32", "kivi:bits=2,group=5",
                                            "kivi:bits=4,group=7", "kivi:bits=4,group=1024"},
                                           /*kivi=*/true),
            5 * 3 * 4 * 6 * 2);
}

TEST(Int8ElementTest, EqualsTheCpuCodecBitForBit) {
  EXPECT_EQ(ExpectElementsEqualTheCpuCodec({"int8"}, /*kivi=*/false), 3 * 4 * 6 * 2);
}

// StoreElement (the kernels' conversion to f16 and bf16) equals the CPU's
// FromFloat on every float whose bits are a multiple of 251 (17 million
// of them, every exponent), and on the classes at the edges: signed zeros,
// infinities, NaNs with payloads high and low, f16's and bf16's halfway
// cases, overflow to infinity, and f16 subnormals.
TEST(StoreElementTest, ConvertsAsTheCpuDoes) {
  std::vector<uint32_t> bits;
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 251) bits.push_back(uint32_t(u));
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t u : {0x0u, 0x7F800000u, 0x7F800001u, 0x7FC00000u, 0x7F810000u, 0x7FFFFFFFu, 0x477FEFFFu, 0x477FF000u,
                       0x477FF001u, 0x38800000u, 0x387FFFFFu, 0x33000000u, 0x33000001u, 0x32FFFFFFu, 0x3F808000u,
                       0x3F818000u, 0x3F808001u, 0x3F801000u, 0x3F803000u, 0x00000001u, 0x007FFFFFu})
      bits.push_back(sign | u);
    for (uint32_t m = 0; m < 0x800000; m += 0x1001) bits.push_back(sign | 0x33800000u | m);  // f16 subnormal range
  }
  for (DType dt : {DType::kF16, DType::kBF16}) {
    std::vector<std::byte> want(4), got(4);  // room for an f32, which these dtypes do not write
    for (uint32_t u : bits) {
      float f;
      std::memcpy(&f, &u, 4);
      codec::FromFloat(dt, &f, want.data(), 1);
      StoreElement(int(dt), f, got.data(), 0);
      ASSERT_EQ(std::memcmp(want.data(), got.data(), 2), 0) << "dtype " << int(dt) << " float bits 0x" << std::hex << u;
    }
  }
  std::vector<std::byte> got(4);
  StoreElement(int(DType::kF32), -1.5f, got.data(), 0);
  float back;
  std::memcpy(&back, got.data(), 4);
  EXPECT_EQ(back, -1.5f);
}

// A slice of ones of `layout`, encoded by `spec`.
std::vector<std::byte> Encoded(const char* spec, const SliceLayout& layout) {
  std::vector<std::byte> raw(layout.Bytes(), std::byte{1});
  CodecContext ctx;
  auto codec = MakeCodec(spec);
  EXPECT_TRUE(codec.ok());
  if (!codec.ok()) return {};
  std::vector<std::byte> enc((*codec)->MaxEncodedSize(layout));
  auto size = (*codec)->Encode(ctx, layout, raw, enc);
  EXPECT_TRUE(size.ok());
  enc.resize(size.ok() ? *size : 0);
  return enc;
}

// Each ParseSlice takes its codec's slice and refuses, by name, the other
// codec's, another layout's, a bad wide flag and a truncated slice.
TEST(ParseSliceTest, RefusesWhatIsNotItsCodecsSliceByName) {
  const SliceLayout layout{KvShape::Mha(2, 2, 16, DType::kF16), 8, 0, 0};
  SliceLayout longer = layout;
  longer.tokens = 9;
  auto int8_parse = [](const SliceLayout& l, std::span<const std::byte> e) { return int8::ParseSlice(l, e).status(); };
  auto kivi_parse = [](const SliceLayout& l, std::span<const std::byte> e) { return kivi::ParseSlice(l, e).status(); };
  struct Case {
    const char* own;
    const char* other;
    std::function<Status(const SliceLayout&, std::span<const std::byte>)> parse;
  };
  for (const Case& c : {Case{"int8", "kivi", int8_parse}, Case{"kivi", "int8", kivi_parse}}) {
    const std::vector<std::byte> own = Encoded(c.own, layout), other = Encoded(c.other, layout);
    ASSERT_FALSE(own.empty() || other.empty());
    EXPECT_TRUE(c.parse(layout, own).ok()) << c.own << ": " << c.parse(layout, own).ToString();
    const Status wrong = c.parse(layout, other);
    EXPECT_NE(wrong.ToString().find("codec id"), std::string::npos) << c.own << ": " << wrong.ToString();
    const Status tokens = c.parse(longer, own);  // not this layout's slice
    EXPECT_NE(tokens.ToString().find("tokens"), std::string::npos) << c.own << ": " << tokens.ToString();
    auto header = codec::ParseHeader(own);
    ASSERT_TRUE(header.ok());
    std::vector<std::byte> flagged = own;
    flagged[codec::kHeaderBytes + header->params_bytes] = std::byte{2};  // the wide flag is 0 or 1
    const Status flag = c.parse(layout, flagged);
    EXPECT_NE(flag.ToString().find("metadata flag"), std::string::npos) << c.own << ": " << flag.ToString();
    std::vector<std::byte> truncated(own.begin(), own.end() - 1);
    EXPECT_FALSE(c.parse(layout, truncated).ok()) << c.own;
  }
}

}  // namespace
}  // namespace flatkv::gpu
