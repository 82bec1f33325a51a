#include "persist/manifest.h"

#include <filesystem>

#include <gtest/gtest.h>

#include "testing/test_util.h"

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

std::vector<uint8_t> CodedLog(uint32_t version) {
  std::vector<uint8_t> b;
  EncodeHeader(b, Header(), version);
  EncodeExtentCreate(b, {0, 0}, 7);
  EncodeBlockPut(b, {0, 0}, {0, {1, 2}, {11, 12}});
  EncodeExtentCreate(b, {0, 1}, 7, "pred:eps=0.01");
  // Slots beyond extent_blocks: a coded extent packs more blocks.
  EncodeBlockPut(b, {0, 1}, {9, {3, 4}, {13, 14}, {0, 0}, {900, 1200}});
  EncodeBlockPut(b, {0, 1}, {10, {5, 6}, {15, 16}, {900, 1200}, {700, 800}});
  return b;
}

ManifestHeader SizedHeader() {
  ManifestHeader h = Header();
  h.unit_blocks = 1;
  return h;
}

// A sized log: units of one block slot (2 layers x 4096 bytes), so a 1 MiB
// segment holds 128 units; extents of 1 and 3 block slots, raw and coded.
std::vector<uint8_t> SizedLog() {
  std::vector<uint8_t> b;
  EncodeHeader(b, SizedHeader(), kManifestVersionSized);
  EncodeExtentCreate(b, {0, 0}, 7, {}, 1);
  EncodeBlockPut(b, {0, 0}, {0, {1, 2}, {11, 12}});
  EncodeExtentCreate(b, {0, 1}, 8, "pred:eps=0.01", 3);
  // A coded extent of 3 slots: up to 48 blocks, slices within 3 x 4096 bytes.
  EncodeBlockPut(b, {0, 1}, {40, {3, 4}, {13, 14}, {0, 8000}, {4000, 4288}});
  EncodeExtentCreate(b, {1, 125}, 9, {}, 3);  // the last three units of segment 1
  return b;
}

TEST(ManifestTest, SizedExtentsRoundTripWithTheirBlockSlots) {
  auto bytes = SizedLog();
  auto c = ParseManifest(bytes);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->torn_tail) << c->tail_problem;
  EXPECT_EQ(c->version, kManifestVersionSized);
  EXPECT_EQ(c->header, SizedHeader());
  EXPECT_EQ(c->header.UnitBytes(), 2u * 4096);
  EXPECT_EQ(c->header.UnitsPerSegment(), 128u);
  EXPECT_EQ(ExtentBlocks(c->header, c->extents.at({0, 0})), 1u);
  const ExtentRecord& coded = c->extents.at({0, 1});
  EXPECT_EQ(coded.block_slots, 3u);
  EXPECT_EQ(coded.codec, "pred:eps=0.01");
  ASSERT_EQ(coded.blocks.size(), 1u);
  EXPECT_EQ(coded.blocks[0].index, 40u);
  EXPECT_EQ(ExtentBlocks(c->header, c->extents.at({1, 125})), 3u);
  for (size_t n = 100; n < bytes.size(); ++n) ASSERT_TRUE(ParseManifest(std::span(bytes).first(n)).ok()) << n;
}

TEST(ManifestTest, SizedRecordsOutsideTheirLayoutEndTheValidPrefix) {
  auto problem = [](const ManifestHeader& h, uint32_t version, auto add) {
    std::vector<uint8_t> b;
    EncodeHeader(b, h, version);
    add(b);
    auto c = ParseManifest(b);
    EXPECT_TRUE(c.ok());
    return c.ok() && c->torn_tail ? c->tail_problem : std::string("none");
  };
  // A sized record where units are not defined, and a fixed one among sized ones.
  EXPECT_NE(problem(Header(), 4, [](auto& b) { EncodeExtentCreate(b, {0, 0}, 7, {}, 2); }).find("without allocation units"),
            std::string::npos);
  EXPECT_NE(problem(SizedHeader(), 5, [](auto& b) { EncodeExtentCreate(b, {0, 0}, 7); }).find("log of sized extents"),
            std::string::npos);
  // More block slots than the largest extent, none, or past the segment's end.
  EXPECT_NE(problem(SizedHeader(), 5, [](auto& b) { EncodeExtentCreate(b, {0, 0}, 7, {}, 5); }).find("at most 4"),
            std::string::npos);
  EXPECT_NE(problem(SizedHeader(), 5, [](auto& b) { EncodeExtentCreate(b, {0, 126}, 7, {}, 3); }).find("beyond segment"),
            std::string::npos);
  // A raw block past the extent's slots; a coded slice past its layer region.
  EXPECT_NE(problem(SizedHeader(), 5,
                    [](auto& b) {
                      EncodeExtentCreate(b, {0, 0}, 7, {}, 2);
                      EncodeBlockPut(b, {0, 0}, {2, {1, 2}, {11, 12}});
                    })
                .find("beyond extent"),
            std::string::npos);
  EXPECT_NE(problem(SizedHeader(), 5,
                    [](auto& b) {
                      EncodeExtentCreate(b, {0, 0}, 7, "pred:eps=0.01", 1);
                      EncodeBlockPut(b, {0, 0}, {0, {1, 2}, {11, 12}, {0, 4000}, {100, 200}});
                    })
                .find("outside the layer region of 4096"),
            std::string::npos);
  // A version 4 header's reserved field is not read as units.
  std::vector<uint8_t> b;
  EncodeHeader(b, SizedHeader(), 4);
  auto c = ParseManifest(b);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->header.sized());
}

TEST(ManifestTest, CodedRecordsRoundTripInAVersion2Log) {
  auto bytes = CodedLog(2);
  auto c = ParseManifest(bytes);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->version, 2u);
  EXPECT_FALSE(c->torn_tail) << c->tail_problem;
  EXPECT_EQ(c->extents.at({0, 0}).codec, "");
  const ExtentRecord& e = c->extents.at({0, 1});
  EXPECT_EQ(e.codec, "pred:eps=0.01");
  ASSERT_EQ(e.blocks.size(), 2u);
  EXPECT_EQ(e.blocks[1].index, 10u);
  EXPECT_EQ(e.blocks[1].offsets, (std::vector<uint32_t>{900, 1200}));
  EXPECT_EQ(e.blocks[1].lengths, (std::vector<uint32_t>{700, 800}));
  EXPECT_EQ(e.blocks[1].checksums, (std::vector<uint64_t>{15, 16}));
  // Every truncation still parses to a valid prefix.
  for (size_t n = 100; n < bytes.size(); ++n) ASSERT_TRUE(ParseManifest(std::span(bytes).first(n)).ok()) << n;
}

TEST(ManifestTest, CodedRecordsAreRejectedInAVersion1LogAndWhenInconsistent) {
  auto c = ParseManifest(CodedLog(1));
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->torn_tail);
  EXPECT_NE(c->tail_problem.find("version 1"), std::string::npos) << c->tail_problem;
  EXPECT_EQ(c->extents.size(), 1u);  // the raw extent before it survives

  auto bad = [](const BlockRecord& block, bool coded_extent) {
    std::vector<uint8_t> b;
    EncodeHeader(b, Header(), 2);
    EncodeExtentCreate(b, {0, 0}, 7, coded_extent ? "raw" : "");
    EncodeBlockPut(b, {0, 0}, block);
    auto c = ParseManifest(b);
    EXPECT_TRUE(c.ok() && c->torn_tail);
    return c.ok() ? c->tail_problem : std::string();
  };
  EXPECT_NE(bad({0, {1, 2}, {1, 2}, {0, 0}, {10, 10}}, false).find("coded block in a raw"), std::string::npos);
  EXPECT_NE(bad({0, {1, 2}, {1, 2}}, true).find("raw block in a coded"), std::string::npos);
  EXPECT_NE(bad({0, {1, 2}, {1, 2}, {0, 4 * 4096 - 10}, {10, 11}}, true).find("outside the layer region"), std::string::npos);
  EXPECT_NE(bad({4 * kCodedBlocksPerSlot, {1, 2}, {1, 2}, {0, 0}, {10, 10}}, true).find("beyond extent"), std::string::npos);
}

// A version 6 block record: key, tag and (coded) stored bytes, no sums.
BlockRecord Tagged(uint32_t index, BlockKey key, uint32_t tag, uint32_t stored = 0) {
  return BlockRecord{index, key, {}, {}, {}, tag, stored};
}

TEST(ManifestTest, TaggedRecordsRoundTripOnlyInAVersion6Log) {
  std::vector<uint8_t> b;
  EncodeHeader(b, SizedHeader(), kManifestVersionTagged);
  EncodeExtentCreate(b, {0, 0}, 7, {}, 1);
  EncodeBlockPut(b, {0, 0}, Tagged(0, {1, 2}, 0xdeadbeef));
  EncodeExtentCreate(b, {0, 1}, 8, "raw", 3);
  EncodeBlockPut(b, {0, 1}, Tagged(40, {3, 4}, 7, 2 * 300));
  auto c = ParseManifest(b);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->torn_tail) << c->tail_problem;
  EXPECT_EQ(c->version, kManifestVersionTagged);
  const TaggedBlock& raw = c->extents.at({0, 0}).tagged.at(0);
  EXPECT_TRUE(c->extents.at({0, 0}).blocks.empty());
  EXPECT_EQ(raw.key, (BlockKey{1, 2}));
  EXPECT_EQ(raw.tag, 0xdeadbeefu);
  const TaggedBlock& coded = c->extents.at({0, 1}).tagged.at(0);
  EXPECT_EQ(coded.index, 40u);
  EXPECT_EQ(coded.stored, 600u);
  EXPECT_EQ(coded.tag, 7u);
  for (size_t n = 100; n < b.size(); ++n) ASSERT_TRUE(ParseManifest(std::span(b).first(n)).ok()) << n;

  auto problem = [](uint32_t version, auto add) {
    std::vector<uint8_t> b;
    EncodeHeader(b, SizedHeader(), version);
    EncodeExtentCreate(b, {0, 0}, 7, {}, 1);
    EncodeExtentCreate(b, {0, 1}, 8, "raw", 1);
    add(b);
    auto c = ParseManifest(b);
    EXPECT_TRUE(c.ok());
    return c.ok() && c->torn_tail ? c->tail_problem : std::string("none");
  };
  // Per-layer block records in a version 6 log, tagged ones in a version 5 log.
  EXPECT_NE(problem(kManifestVersionTagged, [](auto& b) { EncodeBlockPut(b, {0, 0}, {0, {1, 2}, {11, 12}}); })
                .find("per-layer checksums"), std::string::npos);
  EXPECT_NE(problem(kManifestVersionSized, [](auto& b) { EncodeBlockPut(b, {0, 0}, Tagged(0, {1, 2}, 1)); })
                .find("tagged block record type 10 in a version 5 log"), std::string::npos);
  // Stored bytes must fit a coded extent's regions and be 0 in a raw one.
  EXPECT_NE(problem(kManifestVersionTagged, [](auto& b) { EncodeBlockPut(b, {0, 0}, Tagged(0, {1, 2}, 1, 5)); })
                .find("stored bytes in a raw extent"), std::string::npos);
  EXPECT_NE(problem(kManifestVersionTagged, [](auto& b) { EncodeBlockPut(b, {0, 1}, Tagged(0, {1, 2}, 1, 0)); })
                .find("stored bytes in a coded extent"), std::string::npos);
  EXPECT_NE(problem(kManifestVersionTagged, [](auto& b) { EncodeBlockPut(b, {0, 1}, Tagged(0, {1, 2}, 1, 2 * 4096 + 1)); })
                .find("stored bytes in a coded extent"), std::string::npos);
  EXPECT_NE(problem(kManifestVersionTagged, [](auto& b) { EncodeBlockPut(b, {0, 0}, Tagged(1, {1, 2}, 1)); })
                .find("beyond extent"), std::string::npos);
}

// Open replays the log streaming, a chunk (8 MiB) at a time: a log of
// several chunks, whose records straddle the chunk boundaries, replays
// whole, and a torn record in its last chunk is cut off there.
TEST(ManifestTest, OpenReplaysALogOfManyChunks) {
  testing::TempDir dir;
  auto engine = io::MakeThreadPoolEngine(1);
  ManifestContents contents;
  uint64_t blocks = 0;
  {
    auto m = Manifest::Open(dir.path(), SizedHeader(), engine.get(), &contents);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(m.value()->version(), kManifestVersionTagged);
    std::vector<uint8_t> rec;
    for (uint32_t e = 0; e < 6400; ++e) {  // coded extents of 4 slots, 64 blocks each: 18 MB of records
      EncodeExtentCreate(rec, {e / 32, (e % 32) * 4}, e, "raw", 4);
      for (uint32_t i = 0; i < 64; ++i, ++blocks) EncodeBlockPut(rec, {e / 32, (e % 32) * 4}, Tagged(i, {e, i}, i ^ e, 2));
      if (rec.size() > (4 << 20)) {
        ASSERT_TRUE(m.value()->Append(rec, false).ok());
        rec.clear();
      }
    }
    rec.push_back(0x33);  // a torn record at the tail
    ASSERT_TRUE(m.value()->Append(rec, false).ok());
    ASSERT_GT(m.value()->bytes(), 2 * (8u << 20));
  }
  auto m = Manifest::Open(dir.path(), SizedHeader(), engine.get(), &contents);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_TRUE(contents.torn_tail);
  EXPECT_NE(contents.tail_problem.find("truncated record header"), std::string::npos) << contents.tail_problem;
  EXPECT_EQ(contents.good_bytes, std::filesystem::file_size(dir.path() + "/MANIFEST"));  // cut off on open
  uint64_t got = 0;
  for (const auto& [ref, e] : contents.extents) {
    for (uint32_t i = 0; i < e.tagged.size(); ++i) {
      ASSERT_EQ(e.tagged[i].key, (BlockKey{e.session, i}));
      ASSERT_EQ(e.tagged[i].tag, i ^ uint32_t(e.session));
    }
    got += e.tagged.size();
  }
  EXPECT_EQ(got, blocks);
}

// An online checkpoint streams the log's live records into the new one:
// the replayed state is what the old log replayed to, with none of the
// freed extents, superseded sessions records or dropped blocks left.
TEST(ManifestTest, ACheckpointKeepsExactlyTheLiveStateOfTheLog) {
  testing::TempDir dir;
  auto engine = io::MakeThreadPoolEngine(1);
  ManifestContents contents;
  auto opened = Manifest::Open(dir.path(), SizedHeader(), engine.get(), &contents);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Manifest& m = *opened.value();
  std::vector<uint8_t> rec;
  EncodeExtentCreate(rec, {0, 0}, 7, {}, 2);
  EncodeBlockPut(rec, {0, 0}, Tagged(0, {1, 1}, 10));
  EncodeBlockPut(rec, {0, 0}, Tagged(1, {1, 2}, 11));
  EncodeExtentCreate(rec, {0, 2}, 8, "pred:eps=0.01", 1);
  EncodeBlockPut(rec, {0, 2}, Tagged(0, {2, 1}, 12, 110));
  EncodeExtentSessions(rec, {0, 2}, 8, std::vector<uint64_t>{9});
  EncodeExtentSessions(rec, {0, 2}, 9, std::vector<uint64_t>{});  // the owner passed on: only this one counts
  EncodeBlockPositions(rec, {0, 2}, std::vector<std::pair<uint32_t, uint32_t>>{{0, 5}});
  EncodeExtentCreate(rec, {0, 3}, 10, {}, 1);  // created, then freed: gone
  EncodeBlockPut(rec, {0, 3}, Tagged(0, {3, 1}, 13));
  EncodeExtentFree(rec, {0, 3});
  EncodeExtentCreate(rec, {0, 3}, 11, {}, 1);  // the same units again: a new extent
  EncodeBlockPut(rec, {0, 3}, Tagged(0, {3, 2}, 14));
  EncodeBlocksDropped(rec, {0, 0}, std::vector<uint32_t>{1});  // block 1 left the index
  EncodeBlockPut(rec, {0, 0}, Tagged(1, {1, 3}, 15));  // and a later put filled its slot
  ASSERT_TRUE(m.Append(rec, false).ok());
  auto before = ParseManifest([&] {
    std::vector<uint8_t> b;
    EncodeHeader(b, SizedHeader(), kManifestVersionTagged);
    b.insert(b.end(), rec.begin(), rec.end());
    return b;
  }());
  ASSERT_TRUE(before.ok());
  ASSERT_TRUE(m.Checkpoint().ok());
  EXPECT_EQ(m.checkpoints(), 1u);
  EXPECT_LT(m.bytes(), 88 + rec.size());
  opened.value().reset();  // closed: the reopen reads the checkpointed file
  auto again = Manifest::Open(dir.path(), SizedHeader(), engine.get(), &contents);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(contents.torn_tail) << contents.tail_problem;
  EXPECT_EQ(contents.version, kManifestVersionTagged);
  ASSERT_EQ(contents.extents.size(), before->extents.size());
  for (const auto& [ref, e] : before->extents) {
    const ExtentRecord& got = contents.extents.at(ref);
    EXPECT_EQ(got.session, e.session);
    EXPECT_EQ(got.codec, e.codec);
    EXPECT_EQ(got.block_slots, e.block_slots);
    EXPECT_EQ(got.sharers, e.sharers);
    EXPECT_EQ(got.positions, e.positions);
    EXPECT_TRUE(got.blocks.empty());
    ASSERT_EQ(got.tagged.size(), e.tagged.size());
    for (size_t k = 0; k < e.tagged.size(); ++k) {
      EXPECT_EQ(got.tagged[k].index, e.tagged[k].index);
      EXPECT_EQ(got.tagged[k].key, e.tagged[k].key);
      EXPECT_EQ(got.tagged[k].tag, e.tagged[k].tag);
      EXPECT_EQ(got.tagged[k].stored, e.tagged[k].stored);
    }
  }
  EXPECT_EQ(contents.extents.at({0, 0}).tagged.back().key, (BlockKey{1, 3}));
  EXPECT_EQ(contents.extents.at({0, 3}).session, 11u);
  EXPECT_EQ(contents.extents.at({0, 2}).session, 9u);
}

TEST(ManifestTest, UpgradeRaisesTheVersionInPlace) {
  testing::TempDir dir;
  auto engine = io::MakeThreadPoolEngine(1);
  ManifestContents contents;
  {
    auto m = Manifest::Open(dir.path(), Header(), engine.get(), &contents);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(m.value()->version(), 1u);
    std::vector<uint8_t> rec;
    EncodeExtentCreate(rec, {0, 0}, 3);
    ASSERT_TRUE(m.value()->Append(rec, false).ok());
    ASSERT_TRUE(m.value()->Upgrade(kManifestVersionCoded).ok());
    rec.clear();
    EncodeExtentCreate(rec, {0, 1}, 3, "raw");
    ASSERT_TRUE(m.value()->Append(rec, false).ok());
  }
  auto m = Manifest::Open(dir.path(), Header(), engine.get(), &contents);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m.value()->version(), 2u);
  EXPECT_FALSE(contents.torn_tail) << contents.tail_problem;
  ASSERT_EQ(contents.extents.size(), 2u);
  EXPECT_EQ(contents.extents.at({0, 1}).codec, "raw");
}

}  // namespace
}  // namespace flatkv::persist
