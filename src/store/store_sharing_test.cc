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

using namespace flatkv::testing;

// Session 2 continues session 1's chain: the first 8 blocks are session 1's.
void PutShared(Store& store) {
  ASSERT_TRUE(PutChain(store, 1, 1, 8).ok());
  PutResult result;
  ASSERT_TRUE(PutChain(store, 2, 1, 12, &result).ok());
  EXPECT_EQ(result.dedup_blocks, 8u);
  EXPECT_EQ(result.stored_blocks, 4u);
}

TEST(StoreSharingTest, DropSessionFreesOnlyBlocksNoLiveSessionReferences) {
  TempDir dir;
  OnBothTiers(dir, 8, 64, [&](Store& store, bool ssd) {
    PutShared(store);
    EXPECT_EQ(store.Stats().shared_extents, 2u);
    ASSERT_TRUE(store.DropSession(1).ok());
    EXPECT_TRUE(RestoresChain(store, 1, 12)) << ssd;
    EXPECT_EQ(store.Stats().sessions, 1u);
    ASSERT_TRUE(store.DropSession(2).ok());
    EXPECT_EQ(store.Match(ChainKeys(1, 12)), 0u);
    EXPECT_EQ(HeldExtents(store), 0u);
  });
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
      ASSERT_TRUE(PutChain(*store, 1, 1, 8).ok());
      EXPECT_EQ(ManifestVersion(dir.Sub("ssd")), 6u);  // sized extents: version 6 from the start
      PutResult result;
      ASSERT_TRUE(PutChain(*store, 2, 1, 12, &result).ok());
      EXPECT_EQ(ManifestVersion(dir.Sub("ssd")), 6u);
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
  ASSERT_TRUE(PutChain(*store, 1, 1, 8).ok());
  PutResult result;
  PutOptions po;
  po.codec = std::shared_ptr<const Codec>(MakeCodec("raw").value());
  ASSERT_TRUE(PutChain(*store, 2, 1, 8, &result, po).ok());
  EXPECT_EQ(result.dedup_blocks, 8u);
  EXPECT_EQ(result.stored_blocks, 0u);
  EXPECT_EQ(store->Stats().sessions, 2u);
  ASSERT_TRUE(PutChain(*store, 2, 2, 4, &result, po).ok());
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
  auto store = OpenStore(SsdOnlyOptions(dir.Sub("ssd"), 4));
  ASSERT_TRUE(PutChain(*store, 1, 1, 4).ok());
  ASSERT_TRUE(PutChain(*store, 2, 2, 4).ok());
  ASSERT_TRUE(PutChain(*store, 3, 1, 4).ok());  // references session 1's extent
  ASSERT_TRUE(PutChain(*store, 4, 4, 8).ok());  // the SSD is full
  ASSERT_TRUE(PutChain(*store, 5, 5, 4).ok());  // one extent must go
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
    ASSERT_TRUE(PutChain(*store, 1, 1, 4, &result).ok());
    EXPECT_EQ(result.dram_only_blocks, 4u);
    ASSERT_TRUE(PutChain(*store, 2, 2, 4, &result).ok());
    EXPECT_EQ(result.dram_only_blocks, 4u);
    StoreStats st = store->Stats();
    EXPECT_EQ(st.dram_only_blocks, 8u);
    EXPECT_EQ(st.ssd.blocks, 0u);
    EXPECT_EQ(st.ssd.bytes_written, 0u);
    // Session 1 is reused: its blocks go to their SSD home, later puts write through.
    EXPECT_TRUE(RestoresChain(*store, 1, 4));
    EXPECT_EQ(store->Stats().ssd.blocks, 4u);
    ASSERT_TRUE(PutChain(*store, 1, 1, 6, &result).ok());
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
  ASSERT_TRUE(PutChain(*store, 1, 1, 4).ok());
  ASSERT_TRUE(PutChain(*store, 2, 2, 4).ok());  // takes session 1's copy
  EXPECT_EQ(store->Match(ChainKeys(1, 4)), 0u);
  EXPECT_EQ(store->Match(ChainKeys(2, 4)), 4u);
  EXPECT_EQ(store->Stats().dram_only_lost_blocks, 4u);
  EXPECT_EQ(store->Stats().dram_only_blocks, 4u);
}

TEST(StoreDurabilityTest, KillDashNineWithTheDramTierOnLosesNoAcknowledgedBlock) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 16, 4096);
  o.segment_bytes = 16 * kSmallExtentBytes;
  std::vector<uint64_t> done;
  std::unique_ptr<Store> store;
  ASSERT_NO_FATAL_FAILURE(KillDuringPuts(o, dir.Sub("progress"), &done, &store));
  EXPECT_EQ(store->Stats().dram.blocks, 0u);  // the copies died with the process; the homes serve
  for (uint64_t chain : done) ASSERT_NO_FATAL_FAILURE(ExpectChain(*store, chain, KilledChainBlocks(chain)));
  EXPECT_EQ(store->Stats().checksum_failures, 0u);
}

}  // namespace
}  // namespace flatkv
