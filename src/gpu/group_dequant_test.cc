// gpu/group_dequant.h, the arithmetic of the CUDA kivi decoder, compiled
// for the host: every element of a slice, converted to the slice's dtype as
// the CPU codec converts, equals the CPU codec's decode bit for bit, on
// slices of awkward sizes (1 to 333 tokens, head dims 8 to 128, MLA), both
// bit widths, groups that do not divide the rows or channels, f32, f16 and
// bf16, and f16 and f32 (wide) group metadata. ParseSlice refuses what is
// not a kivi slice, by name.
#include "gpu/group_dequant.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "codec/dtype.h"
#include "testing/test_util.h"

namespace flatkv::gpu::kivi {
namespace {

// Decodes `enc` element by element with gpu/group_dequant.h into `out` (dtype bytes).
Status DecodeByElements(const SliceLayout& layout, std::span<const std::byte> enc, std::vector<std::byte>& out) {
  FLATKV_ASSIGN_OR_RETURN(Slice s, ParseSlice(layout, enc));
  const uint8_t* body = reinterpret_cast<const uint8_t*>(enc.data() + s.body);
  const uint64_t es = DTypeBytes(layout.shape.dtype);
  for (uint32_t k = 0; k < s.parts; ++k) {
    const Part& p = s.part[k];
    for (uint32_t row = 0; row < p.rows; ++row)
      for (uint32_t c = 0; c < p.width; ++c) {
        const float y = Element(body, p, s.wide, row, c);
        codec::FromFloat(layout.shape.dtype, &y, out.data() + (p.base + uint64_t(row) * p.row_stride + c) * es, 1);
      }
  }
  return Status::Ok();
}

TEST(KiviElementTest, EqualsTheCpuCodecBitForBit) {
  std::mt19937 rng(3);
  int cases = 0;
  for (const char* spec : {"kivi:bits=2,group=32", "kivi:bits=4,group=32", "kivi:bits=2,group=5", "kivi:bits=4,group=7",
                           "kivi:bits=4,group=1024"}) {
    auto codec = MakeCodec(spec);
    ASSERT_TRUE(codec.ok()) << spec << ": " << codec.status().ToString();
    for (DType dt : {DType::kF32, DType::kF16, DType::kBF16})
      for (uint32_t tokens : {1u, 17u, 64u, 333u})
        for (const KvShape& shape : {KvShape::Mha(2, 1, 8, dt), KvShape::Mha(2, 3, 64, dt), KvShape::Mha(2, 5, 72, dt),
                                     KvShape::Mha(2, 8, 128, dt), KvShape::Mla(2, 96, 16, dt)})
          for (float scale : {1.0f, 1e6f}) {  // 1e6: past f16's range, so the groups' metadata is f32 (wide)
            const SliceLayout layout{shape, tokens, 1, 0};
            const testing::CodedSlice slice = testing::EncodeKvSlice(**codec, layout, rng, scale);
            ASSERT_FALSE(slice.decoded.empty());
            std::vector<std::byte> got(layout.Bytes(), std::byte{0xEE});
            Status by_elements = DecodeByElements(layout, slice.encoded, got);
            ASSERT_TRUE(by_elements.ok()) << by_elements.ToString();
            ASSERT_EQ(std::memcmp(got.data(), slice.decoded.data(), got.size()), 0)
                << spec << " dtype " << int(dt) << " tokens " << tokens << " dims " << shape.kv_heads << "x" << shape.head_dim
                << " scale " << scale;
            ++cases;
          }
  }
  EXPECT_EQ(cases, 5 * 3 * 4 * 5 * 2);
}

TEST(KiviElementTest, ParseSliceRefusesWhatIsNotAKiviSliceByName) {
  const KvShape shape = KvShape::Mha(2, 2, 16, DType::kF16);
  SliceLayout layout{shape, 8, 0, 0};
  std::vector<std::byte> raw(layout.Bytes(), std::byte{1});
  CodecContext ctx;
  auto int8 = MakeCodec("int8");
  ASSERT_TRUE(int8.ok());
  std::vector<std::byte> enc((*int8)->MaxEncodedSize(layout));
  auto size = (*int8)->Encode(ctx, layout, raw, enc);
  ASSERT_TRUE(size.ok());
  enc.resize(*size);
  auto s = ParseSlice(layout, enc);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().ToString().find("codec id"), std::string::npos) << s.status().ToString();

  auto kivi = MakeCodec("kivi");
  ASSERT_TRUE(kivi.ok());
  enc.assign((*kivi)->MaxEncodedSize(layout), std::byte{0});
  size = (*kivi)->Encode(ctx, layout, raw, enc);
  ASSERT_TRUE(size.ok());
  enc.resize(*size);
  ASSERT_TRUE(ParseSlice(layout, enc).ok());
  SliceLayout longer = layout;
  longer.tokens = 9;
  EXPECT_FALSE(ParseSlice(longer, enc).ok());  // not this layout's slice
  enc.resize(enc.size() - 1);                  // truncated
  EXPECT_FALSE(ParseSlice(layout, enc).ok());
}

}  // namespace
}  // namespace flatkv::gpu::kivi
