// Store::Prefetch: SSD-only blocks come into DRAM copies in the background
// (whatever readmit_on_restore says), so the restore that follows reads no
// SSD; DRAM-resident chains cost nothing; a full prefetch queue only counts;
// a store closed or destroyed with prefetches in flight waits for them.
#include <gtest/gtest.h>


#include "flatkv/store.h"
#include "testing/test_util.h"

namespace flatkv {
namespace {

using namespace flatkv::testing;

TEST(StorePrefetchTest, SsdBlocksComeIntoDramAndTheNextRestoreReadsNoSsd) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 4, 16);
  o.session_dram_share_bytes = 4 * kSmallExtentBytes;
  o.readmit_on_restore = false;  // prefetch re-admits regardless
  auto store = OpenStore(o);
  const auto data = Payload(*store, 8, 1);
  ASSERT_TRUE(store->Put(1, ChainKeys(1, 8), data, {PutHint::kOneShot}).ok());  // SSD homes only
  ASSERT_EQ(store->Stats().dram.blocks, 0u);
  // A longer chain: the stored prefix is what counts.
  auto found = store->Prefetch(ChainKeys(1, 12));
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(*found, 8u);
  EXPECT_EQ(store->Stats().prefetches, 1u);
  ASSERT_TRUE(Eventually([&] { return store->Stats().readmitted_blocks == 8; }))
      << "readmitted " << store->Stats().readmitted_blocks;
  ASSERT_TRUE(Eventually([&] { return store->Stats().prefetches_done == 1; }));
  const StoreStats before = store->Stats();
  EXPECT_EQ(before.dram.blocks, 8u);
  std::vector<std::byte> got;
  EXPECT_EQ(RestoreAll(*store, ChainKeys(1, 8), &got), 8u);
  EXPECT_TRUE(got == data);
  const StoreStats after = store->Stats();
  EXPECT_EQ(after.dram.hit_blocks - before.dram.hit_blocks, 8u);
  EXPECT_EQ(after.ssd.hit_blocks - before.ssd.hit_blocks, 0u);
  EXPECT_EQ(after.ssd.bytes_read, before.ssd.bytes_read);
  // Now in DRAM: another prefetch starts nothing.
  EXPECT_EQ(store->Prefetch(ChainKeys(1, 8)).value(), 8u);
  EXPECT_EQ(store->Stats().prefetches, 1u);
  // Nothing stored: nothing found, nothing started.
  EXPECT_EQ(store->Prefetch(ChainKeys(9, 4)).value(), 0u);
  EXPECT_EQ(store->Stats().prefetches, 1u);
}

TEST(StorePrefetchTest, EveryPrefetchThatFindsSsdBlocksRunsOrIsCountedSkipped) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 4, 64);
  auto store = OpenStore(o);
  constexpr int kChains = 24;
  for (int c = 1; c <= kChains; ++c)
    ASSERT_TRUE(store->Put(c, ChainKeys(c, 2), Payload(*store, 2, c), {PutHint::kOneShot}).ok());
  for (int c = 1; c <= kChains; ++c) EXPECT_EQ(store->Prefetch(ChainKeys(c, 2)).value(), 2u);
  const StoreStats st = store->Stats();
  EXPECT_EQ(st.prefetches + st.prefetch_skipped, uint64_t{kChains});
  EXPECT_GE(st.prefetches, 1u);
  // What was prefetched is still right wherever it is served from.
  for (int c = 1; c <= kChains; ++c) {
    EXPECT_TRUE(RestoresChain(*store, c, 2)) << "chain " << c;
  }
  // Every prefetch that started finishes, and says so.
  EXPECT_TRUE(Eventually([&] { return store->Stats().prefetches_done == st.prefetches; }))
      << store->Stats().prefetches_done << " of " << st.prefetches;
}

TEST(StorePrefetchTest, ClosingOrDestroyingWaitsForPrefetchesInFlight) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 4, 64);
  {
    auto store = OpenStore(o);
    for (int c = 1; c <= 4; ++c) {
      ASSERT_TRUE(store->Put(c, ChainKeys(c, 4), Payload(*store, 4, c), {PutHint::kOneShot}).ok());
      EXPECT_EQ(store->Prefetch(ChainKeys(c, 4)).value(), 4u);
    }
    ASSERT_TRUE(store->Close().ok());
    auto closed = store->Prefetch(ChainKeys(1, 4));
    EXPECT_EQ(closed.status().code(), Code::kFailedPrecondition);
    EXPECT_NE(closed.status().message().find("closed"), std::string::npos);
  }
  {
    auto store = OpenStore(o);  // reopened warm; destroyed at once with prefetches running
    for (int c = 1; c <= 4; ++c) EXPECT_EQ(store->Prefetch(ChainKeys(c, 4)).value(), 4u);
  }
  auto store = OpenStore(o);
  for (int c = 1; c <= 4; ++c) {
    EXPECT_TRUE(RestoresChain(*store, c, 4));
  }
}

}  // namespace
}  // namespace flatkv
