// Sessions that share blocks (references, DropSession, eviction, restart),
// SSD admission on reuse (kOnReuse), kill -9 with the DRAM tier on, and a
// restart of a store written in the previous manifest format.
#include <gtest/gtest.h>

#include <filesystem>

#include "flatkv/codec.h"
#include "flatkv/store.h"
#include "testing/test_util.h"

namespace flatkv {
namespace {

using testing::ChainKeys;
using testing::ManifestVersion;
using testing::OpenStore;
using testing::Payload;
using testing::PutUntilKilled;
using testing::RestoreAll;
using testing::SmallOptions;
using testing::TempDir;

// Session 2 continues session 1's chain: the first 8 blocks are session 1's.
void PutShared(Store& store) {
  ASSERT_TRUE(store.Put(1, ChainKeys(1, 8), Payload(store, 8, 1)).ok());
  PutResult result;
  PutOptions po;
  po.result = &result;
  ASSERT_TRUE(store.Put(2, ChainKeys(1, 12), Payload(store, 12, 1), po).ok());
  EXPECT_EQ(result.dedup_blocks, 8u);
  EXPECT_EQ(result.stored_blocks, 4u);
}

TEST(StoreSharingTest, DropSessionFreesOnlyBlocksNoLiveSessionReferences) {
  TempDir dir;
  for (bool ssd : {true, false}) {
    StoreOptions o = SmallOptions(ssd ? dir.Sub("ssd") : "", 8, 64);
    auto store = OpenStore(o);
    PutShared(*store);
    EXPECT_EQ(store->Stats().shared_extents, 2u);
    ASSERT_TRUE(store->DropSession(1).ok());
    std::vector<std::byte> got;
    EXPECT_EQ(RestoreAll(*store, ChainKeys(1, 12), &got), 12u) << ssd;
    EXPECT_TRUE(got == Payload(*store, 12, 1));
    EXPECT_EQ(store->Stats().sessions, 1u);
    ASSERT_TRUE(store->DropSession(2).ok());
    EXPECT_EQ(store->Match(ChainKeys(1, 12)), 0u);
    EXPECT_EQ(store->Stats().ssd.extents + store->Stats().dram.extents, 0u);
    store.reset();
    std::filesystem::remove_all(dir.Sub("ssd"));
  }
}

TEST(StoreSharingTest, ADropOfTheReferencingSessionLeavesTheOwnersBlocks) {
  TempDir dir;
  auto store = OpenStore(SmallOptions(dir.Sub("ssd"), 8, 64));
  PutShared(*store);
  ASSERT_TRUE(store->DropSession(2).ok());
  EXPECT_EQ(store->Match(ChainKeys(1, 12)), 8u);
  EXPECT_EQ(store->Stats().shared_extents, 0u);
}

TEST(StoreSharingTest, ReferencesSurviveARestart) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 8, 64);
  for (bool clean : {true, false}) {
    std::filesystem::remove_all(dir.Sub("ssd"));
    {
      auto store = OpenStore(o);
      ASSERT_TRUE(store->Put(1, ChainKeys(1, 8), Payload(*store, 8, 1)).ok());
      EXPECT_EQ(ManifestVersion(dir.Sub("ssd")), 5u);  // sized extents: version 5 from the start
      PutResult result;
      PutOptions po;
      po.result = &result;
      ASSERT_TRUE(store->Put(2, ChainKeys(1, 12), Payload(*store, 12, 1), po).ok());
      EXPECT_EQ(ManifestVersion(dir.Sub("ssd")), 5u);
      if (clean) {
        ASSERT_TRUE(store->Close().ok());
      } else {
        auto second = OpenStore(o);  // a second opener sees the uncompacted log
        ASSERT_TRUE(second);
        EXPECT_EQ(second->Stats().shared_extents, 2u);
        ASSERT_TRUE(second->DropSession(1).ok());
        EXPECT_EQ(second->Match(ChainKeys(1, 12)), 12u);
        continue;
      }
    }
    auto store = OpenStore(o);
    EXPECT_EQ(store->Stats().shared_extents, 2u) << clean;
    ASSERT_TRUE(store->DropSession(1).ok());
    EXPECT_EQ(store->Match(ChainKeys(1, 12)), 12u);
    ASSERT_TRUE(store->Close().ok());
    store = OpenStore(o);
    EXPECT_EQ(store->Match(ChainKeys(1, 12)), 12u);  // session 2 owns them now, also after a restart
    ASSERT_TRUE(store->DropSession(2).ok());
    EXPECT_EQ(store->Match(ChainKeys(1, 12)), 0u);
  }
}

// A coded put whose every block another session already holds makes its
// session a sharer: the session must be a whole one (in the LRU order), so
// that its next put, its drop and eviction can find it.
TEST(StoreSharingTest, ACodedPutOfOnlySharedBlocksStartsAWholeSession) {
  TempDir dir;
  auto store = OpenStore(SmallOptions(dir.Sub("ssd"), 8, 64));
  ASSERT_TRUE(store->Put(1, ChainKeys(1, 8), Payload(*store, 8, 1)).ok());
  PutResult result;
  PutOptions po;
  po.codec = std::shared_ptr<const Codec>(MakeCodec("raw").value());
  po.result = &result;
  ASSERT_TRUE(store->Put(2, ChainKeys(1, 8), Payload(*store, 8, 1), po).ok());
  EXPECT_EQ(result.dedup_blocks, 8u);
  EXPECT_EQ(result.stored_blocks, 0u);
  EXPECT_EQ(store->Stats().sessions, 2u);
  ASSERT_TRUE(store->Put(2, ChainKeys(2, 4), Payload(*store, 4, 2), po).ok());
  ASSERT_TRUE(store->DropSession(1).ok());
  EXPECT_EQ(store->Match(ChainKeys(1, 8)), 8u);  // session 2 holds them now
  ASSERT_TRUE(store->DropSession(2).ok());
  EXPECT_EQ(store->Match(ChainKeys(1, 8)), 0u);
  EXPECT_EQ(store->Stats().sessions, 0u);
}

// An extent other sessions reference counts for their recency: SSD
// eviction passes over a least recently used owner's shared extent.
TEST(StoreSharingTest, EvictionCountsAnExtentForItsMostRecentHolder) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 0, 4);
  o.dram_capacity_bytes = 0;
  auto store = OpenStore(o);
  ASSERT_TRUE(store->Put(1, ChainKeys(1, 4), Payload(*store, 4, 1)).ok());
  ASSERT_TRUE(store->Put(2, ChainKeys(2, 4), Payload(*store, 4, 2)).ok());
  ASSERT_TRUE(store->Put(3, ChainKeys(1, 4), Payload(*store, 4, 1)).ok());  // references session 1's extent
  ASSERT_TRUE(store->Put(4, ChainKeys(4, 8), Payload(*store, 8, 4)).ok());  // the SSD is full
  ASSERT_TRUE(store->Put(5, ChainKeys(5, 4), Payload(*store, 4, 5)).ok());  // one extent must go
  EXPECT_EQ(store->Match(ChainKeys(1, 4)), 4u);  // session 1 is the least recent, but session 3 holds it
  EXPECT_EQ(store->Match(ChainKeys(2, 4)), 0u);
  EXPECT_EQ(store->Match(ChainKeys(5, 4)), 4u);
}

TEST(StoreAdmissionTest, OnReuseKeepsASessionInDramUntilARestoreHitsIt) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 8, 64);
  o.ssd_admission = SsdAdmission::kOnReuse;
  {
    auto store = OpenStore(o);
    PutResult result;
    PutOptions po;
    po.result = &result;
    ASSERT_TRUE(store->Put(1, ChainKeys(1, 4), Payload(*store, 4, 1), po).ok());
    EXPECT_EQ(result.dram_only_blocks, 4u);
    ASSERT_TRUE(store->Put(2, ChainKeys(2, 4), Payload(*store, 4, 2), po).ok());
    EXPECT_EQ(result.dram_only_blocks, 4u);
    StoreStats st = store->Stats();
    EXPECT_EQ(st.dram_only_blocks, 8u);
    EXPECT_EQ(st.ssd.blocks, 0u);
    EXPECT_EQ(st.ssd.bytes_written, 0u);
    // Session 1 is reused: its blocks go to their SSD home, later puts write through.
    std::vector<std::byte> got;
    EXPECT_EQ(RestoreAll(*store, ChainKeys(1, 4), &got), 4u);
    EXPECT_TRUE(got == Payload(*store, 4, 1));
    EXPECT_EQ(store->Stats().ssd.blocks, 4u);
    ASSERT_TRUE(store->Put(1, ChainKeys(1, 6), Payload(*store, 6, 1), po).ok());
    EXPECT_EQ(result.stored_blocks, 2u);
    EXPECT_EQ(result.dram_only_blocks, 0u);
    st = store->Stats();
    EXPECT_EQ(st.ssd.blocks, 6u);
    EXPECT_EQ(st.dram_only_blocks, 4u);  // session 2's
    ASSERT_TRUE(store->Close().ok());
  }
  auto store = OpenStore(o);
  EXPECT_EQ(store->Match(ChainKeys(1, 6)), 6u);  // reused: durable
  EXPECT_EQ(store->Match(ChainKeys(2, 4)), 0u);  // never reused: DRAM-only, gone with the process
}

TEST(StoreAdmissionTest, OnReuseLosesDramOnlyBlocksWhenTheirCopyIsReclaimed) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 1, 64);  // one DRAM extent
  o.ssd_admission = SsdAdmission::kOnReuse;
  o.session_dram_share_bytes = 1ull << 40;
  auto store = OpenStore(o);
  ASSERT_TRUE(store->Put(1, ChainKeys(1, 4), Payload(*store, 4, 1)).ok());
  ASSERT_TRUE(store->Put(2, ChainKeys(2, 4), Payload(*store, 4, 2)).ok());  // takes session 1's copy
  EXPECT_EQ(store->Match(ChainKeys(1, 4)), 0u);
  EXPECT_EQ(store->Match(ChainKeys(2, 4)), 4u);
  EXPECT_EQ(store->Stats().dram_only_lost_blocks, 4u);
  EXPECT_EQ(store->Stats().dram_only_blocks, 4u);
}

TEST(StoreDurabilityTest, KillDashNineWithTheDramTierOnLosesNoAcknowledgedBlock) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 16, 4096);
  o.segment_bytes = 16ull * 4 * 16384 * 5;
  std::vector<uint64_t> done;
  ASSERT_NO_FATAL_FAILURE(PutUntilKilled(o, dir.Sub("progress"), 40, 20000, [](Store& store, uint64_t chain) {
    const size_t blocks = 1 + chain % 7;
    return store.Put(chain % 5, ChainKeys(chain, blocks), Payload(store, blocks, chain));
  }, &done));
  ASSERT_GT(done.size(), 5u);
  auto store = OpenStore(o);
  ASSERT_TRUE(store);
  EXPECT_EQ(store->Stats().dram.blocks, 0u);  // the copies died with the process; the homes serve
  for (uint64_t chain : done) {
    const size_t blocks = 1 + chain % 7;
    std::vector<std::byte> got;
    ASSERT_EQ(RestoreAll(*store, ChainKeys(chain, blocks), &got), blocks) << "chain " << chain;
    ASSERT_TRUE(got == Payload(*store, blocks, chain)) << "chain " << chain;
  }
  EXPECT_EQ(store->Stats().checksum_failures, 0u);
}

}  // namespace
}  // namespace flatkv
