// Capacity accounting, placement and eviction order.
#include <gtest/gtest.h>

#include <memory>

#include "flatkv/store.h"
#include "testing/test_util.h"

namespace flatkv {
namespace {

using namespace flatkv::testing;

class EvictionTest : public ::testing::TestWithParam<Medium> {};

TEST_P(EvictionTest, CapacityHoldsExactlyAndTheLeastRecentSessionGoesFirst) {
  TempDir dir;
  const Medium m = GetParam();
  StoreOptions o = SmallOptions(m == Medium::kSsd ? dir.Sub("ssd") : "", 0, 0);
  o.sized_extents = false;  // whole extents of 4 blocks (sized ones: StoreSizedTest)
  // Room for 4.5 extents: only 4 may ever be allocated.
  if (m == Medium::kDram) o.dram_capacity_bytes = 4 * kSmallExtentBytes + kSmallExtentBytes / 2;
  else {
    o.dram_capacity_bytes = 0;
    o.ssd_capacity_bytes = 4 * kSmallExtentBytes + kSmallExtentBytes / 2;
  }
  o.session_dram_share_bytes = 1ull << 40;
  auto store = OpenStore(o);
  auto medium = [&] { return m == Medium::kDram ? store->Stats().dram : store->Stats().ssd; };

  ASSERT_TRUE(PutChain(*store, 1, 1, 8).ok());  // session 1: extents 1, 2
  ASSERT_TRUE(PutChain(*store, 2, 2, 8).ok());  // session 2: extents 3, 4
  EXPECT_EQ(medium().extents, 4u);
  EXPECT_EQ(medium().used_bytes, 4 * kSmallExtentBytes);
  EXPECT_LE(medium().used_bytes, medium().capacity_bytes);

  EXPECT_EQ(RestoreAll(*store, ChainKeys(1, 8), nullptr), 8u);  // session 1 is now the most recent
  ASSERT_TRUE(PutChain(*store, 3, 3, 4).ok());  // needs one extent: session 2 (LRU) loses its newest extent
  EXPECT_EQ(medium().extents, 4u);
  EXPECT_EQ(store->Match(ChainKeys(2, 8)), 4u);  // its prefix survives
  EXPECT_EQ(store->Match(ChainKeys(1, 8)), 8u);
  EXPECT_EQ(store->Match(ChainKeys(3, 4)), 4u);
  EXPECT_EQ(medium().evicted_extents, 1u);
  EXPECT_EQ(medium().evicted_blocks, 4u);

  ASSERT_TRUE(PutChain(*store, 3, 4, 4).ok());  // session 2 is still least recent: its last extent goes
  EXPECT_EQ(store->Match(ChainKeys(2, 8)), 0u);
  EXPECT_EQ(store->Match(ChainKeys(1, 8)), 8u);
  EXPECT_EQ(medium().evicted_extents, 2u);
  EXPECT_EQ(medium().used_bytes, 4 * kSmallExtentBytes);

  // Evicted blocks are misses, and the survivors still restore their own bytes.
  EXPECT_TRUE(RestoresChain(*store, 1, 8));
}

INSTANTIATE_TEST_SUITE_P(Media, EvictionTest, ::testing::Values(Medium::kDram, Medium::kSsd),
                         [](const auto& info) { return std::string(MediumName(info.param)); });

// With an SSD tier every block's home is on SSD; a full DRAM gives the
// newest session copies by dropping the least recent session's, and no
// block is lost.
TEST(PlacementTest, FullDramMovesCopiesToTheActiveSessionWithoutDroppingBlocks) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 2, 16);
  o.session_dram_share_bytes = 1ull << 40;
  auto store = OpenStore(o);
  ASSERT_TRUE(PutChain(*store, 1, 1, 8).ok());  // copies fill DRAM (2 extents)
  EXPECT_EQ(store->Stats().dram.extents, 2u);
  EXPECT_EQ(store->Stats().ssd.extents, 2u);
  ASSERT_TRUE(PutChain(*store, 2, 2, 8).ok());  // session 1's copies go to session 2
  EXPECT_EQ(store->Stats().ssd.extents, 4u);
  EXPECT_EQ(store->Stats().dram.evicted_extents, 2u);
  EXPECT_EQ(store->Stats().ssd.evicted_extents, 0u);
  EXPECT_EQ(store->Match(ChainKeys(1, 8)), 8u);
  EXPECT_EQ(store->Match(ChainKeys(2, 8)), 8u);
}

TEST(PlacementTest, SessionsOutgrowingTheirShareAndOneShotBlocksHaveNoDramCopy) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 16, 16);
  o.session_dram_share_bytes = 2 * kSmallExtentBytes;
  auto store = OpenStore(o);
  ASSERT_TRUE(PutChain(*store, 1, 1, 16).ok());  // 4 SSD extents, copies of the 2 within the share
  EXPECT_EQ(store->Stats().dram.extents, 2u);
  EXPECT_EQ(store->Stats().ssd.extents, 4u);
  ASSERT_TRUE(store->Put(2, ChainKeys(2, 4), Payload(*store, 4, 2), {PutHint::kOneShot}).ok());
  EXPECT_EQ(store->Stats().ssd.extents, 5u);
  EXPECT_EQ(store->Stats().dram.extents, 2u);
  // A restore spanning copies and SSD homes returns every byte in order.
  EXPECT_TRUE(RestoresChain(*store, 1, 16));
}

TEST(PlacementTest, NoSpaceWhenNothingCanBeEvicted) {
  TempDir dir;
  StoreOptions o = SmallOptions("", 2, 0);
  auto store = OpenStore(o);
  ASSERT_TRUE(PutChain(*store, 1, 1, 8).ok());  // fills DRAM with one session
  // A restore in flight pins both extents: nothing may be freed under it.
  auto restore = store->StartRestore(ChainKeys(1, 8));
  ASSERT_TRUE(restore.ok());
  Status s = PutChain(*store, 1, 9, 4);
  EXPECT_EQ(s.code(), Code::kNoSpace) << s.ToString();
  EXPECT_EQ(restore.value()->Finish(), 8u);
  restore.value().reset();
  EXPECT_EQ(store->Match(ChainKeys(1, 8)), 8u);  // nothing already stored was lost
}

}  // namespace
}  // namespace flatkv

namespace flatkv {
namespace {

// A session alone in a full store makes room from its own least recently
// used extents (say, history its context no longer includes), not by
// refusing new blocks and not at the cost of the prefix it keeps reading.
TEST(EvictionTest, ALoneSessionReclaimsItsOwnLeastRecentlyUsedExtents) {
  TempDir dir;
  StoreOptions o = SsdOnlyOptions(dir.Sub("ssd"), 4);
  auto now = std::make_shared<std::chrono::steady_clock::time_point>();
  o.clock = [now] { return *now; };
  auto store = OpenStore(o);
  ASSERT_TRUE(PutChain(*store, 1, 1, 8).ok());  // old history: 2 extents
  *now += std::chrono::seconds(1);
  ASSERT_TRUE(PutChain(*store, 1, 2, 8).ok());  // the live context: 2 extents; the SSD is full
  *now += std::chrono::seconds(1);
  EXPECT_EQ(RestoreAll(*store, ChainKeys(2, 8), nullptr), 8u);  // the live context is read again
  *now += std::chrono::seconds(1);
  ASSERT_TRUE(PutChain(*store, 1, 3, 4).ok());  // needs one extent
  EXPECT_EQ(store->Match(ChainKeys(2, 8)), 8u);
  EXPECT_EQ(store->Match(ChainKeys(3, 4)), 4u);
  EXPECT_LT(store->Match(ChainKeys(1, 8)), 8u);
  EXPECT_EQ(store->Stats().ssd.evicted_extents, 1u);
  EXPECT_EQ(store->Stats().ssd.extents, 4u);
}

}  // namespace
}  // namespace flatkv
