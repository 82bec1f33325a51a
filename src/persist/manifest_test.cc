#include "persist/manifest.h"

#include <gtest/gtest.h>

namespace flatkv::persist {
namespace {

ManifestHeader Header() {
  ManifestHeader h;
  h.shape = KvShape::Mha(2, 1, 16, DType::kF16);
  h.block_tokens = 64;
  h.segment_bytes = 1 << 20;
  h.extent_blocks = 4;
  h.slot_stride = 4096;
  h.layer_stride = 4 * 4096;
  h.extent_bytes = 2 * 4 * 4096;
  return h;
}

std::vector<uint8_t> SampleLog() {
  std::vector<uint8_t> b;
  EncodeHeader(b, Header());
  EncodeExtentCreate(b, {0, 0}, 7);
  EncodeBlockPut(b, {0, 0}, {0, {1, 2}, {11, 12}});
  EncodeBlockPut(b, {0, 0}, {1, {3, 4}, {13, 14}});
  EncodeExtentCreate(b, {0, 1}, 8);
  EncodeBlockPut(b, {0, 1}, {0, {5, 6}, {15, 16}});
  EncodeExtentFree(b, {0, 1});
  return b;
}

TEST(ManifestTest, RoundTrip) {
  auto bytes = SampleLog();
  auto c = ParseManifest(bytes);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->header, Header());
  EXPECT_FALSE(c->torn_tail);
  EXPECT_EQ(c->good_bytes, bytes.size());
  ASSERT_EQ(c->extents.size(), 1u);
  const ExtentRecord& e = c->extents.at({0, 0});
  EXPECT_EQ(e.session, 7u);
  ASSERT_EQ(e.blocks.size(), 2u);
  EXPECT_EQ(e.blocks[1].key, (BlockKey{3, 4}));
  EXPECT_EQ(e.blocks[1].checksums, (std::vector<uint64_t>{13, 14}));
}

TEST(ManifestTest, EveryTruncationKeepsAValidPrefix) {
  auto full = SampleLog();
  std::vector<uint8_t> header_only;
  EncodeHeader(header_only, Header());
  for (size_t n = header_only.size(); n < full.size(); ++n) {
    auto c = ParseManifest(std::span(full).first(n));
    ASSERT_TRUE(c.ok()) << n;
    EXPECT_LE(c->good_bytes, n);
    EXPECT_EQ(c->torn_tail, c->good_bytes != n) << n;
  }
  for (size_t n = 0; n < header_only.size(); ++n) EXPECT_FALSE(ParseManifest(std::span(full).first(n)).ok()) << n;
}

TEST(ManifestTest, AFlippedByteEndsTheLogThereAndNeverYieldsOtherData) {
  auto full = SampleLog();
  std::vector<uint8_t> header_only;
  EncodeHeader(header_only, Header());
  for (size_t i = header_only.size(); i < full.size(); ++i) {
    auto bytes = full;
    bytes[i] ^= 0x40;
    auto c = ParseManifest(bytes);
    ASSERT_TRUE(c.ok()) << i;
    EXPECT_TRUE(c->torn_tail) << i;
    EXPECT_LE(c->good_bytes, i);
  }
}

TEST(ManifestTest, BadHeadersAreRejectedWithAReason) {
  auto bytes = SampleLog();
  auto magic = bytes;
  magic[0] = 'X';
  EXPECT_NE(ParseManifest(magic).status().message().find("magic"), std::string::npos);
  auto version = bytes;
  version[8] = 99;
  EXPECT_EQ(ParseManifest(version).status().code(), Code::kNotSupported);
  auto sum = bytes;
  sum[20] ^= 1;
  EXPECT_EQ(ParseManifest(sum).status().code(), Code::kCorruption);
}

TEST(ManifestTest, ContradictoryRecordsEndTheValidPrefix) {
  std::vector<uint8_t> b;
  EncodeHeader(b, Header());
  size_t good = b.size();
  EncodeBlockPut(b, {0, 3}, {0, {1, 2}, {1, 2}});  // unknown extent
  auto c = ParseManifest(b);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->torn_tail);
  EXPECT_EQ(c->good_bytes, good);
  EXPECT_NE(c->tail_problem.find("unknown extent"), std::string::npos);
}

}  // namespace
}  // namespace flatkv::persist
