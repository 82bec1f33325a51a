// Sized extents (docs/format_segment.md, "Sized extents"): a new extent
// holds about the blocks its put still places and at least an eighth of
// what its session holds, so short sessions take little more than their
// blocks and long ones few extents; space freed in runs of any size is
// reused without crossing a segment.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "flatkv/store.h"
#include "persist/manifest.h"
#include "testing/test_util.h"

namespace flatkv {
namespace {

using namespace flatkv::testing;

constexpr uint64_t kSlotBytes = 16384ull * 5;  // SmallOptions: one block slot over 5 layers

// SmallOptions with extents of up to 64 blocks (1 MiB per layer) and no DRAM.
StoreOptions Wide(const std::string& dir, uint64_t ssd_blocks) {
  StoreOptions o = SsdOnlyOptions(dir, 0);
  o.ssd_extent_layer_bytes = 1 << 20;
  o.segment_bytes = 128 * kSlotBytes;
  o.ssd_capacity_bytes = ssd_blocks * kSlotBytes;
  return o;
}


TEST(StoreSizedTest, AShortSessionTakesItsBlocksNotAWholeExtent) {
  for (bool sized : {true, false}) {
    TempDir dir;
    StoreOptions o = Wide(dir.Sub("ssd"), 4096);
    o.sized_extents = sized;
    auto store = OpenStore(o);
    for (uint64_t s = 1; s <= 40; ++s) ASSERT_TRUE(PutChain(*store, s, s, 3).ok());
    const StoreStats st = store->Stats();
    EXPECT_EQ(st.ssd.extents, 40u);
    EXPECT_EQ(st.ssd.logical_bytes, 40 * 3 * kSlotBytes);
    // Sized: 3 block slots each; fixed: 64 each (2.3% of it used).
    EXPECT_EQ(st.ssd.used_bytes, 40 * (sized ? 3 : 64) * kSlotBytes) << sized;
    EXPECT_EQ(st.ssd.allocated_bytes, st.ssd.used_bytes);
    for (uint64_t s = 1; s <= 40; ++s) ASSERT_NO_FATAL_FAILURE(ExpectChain(*store, s, 3));
    EXPECT_EQ(testing::ManifestVersion(dir.Sub("ssd")), sized ? persist::kManifestVersionTagged : 4u);
  }
}

TEST(StoreSizedTest, ALongSessionPutBlockByBlockGetsGeometricallyGrowingExtents) {
  TempDir dir;
  auto store = OpenStore(Wide(dir.Sub("ssd"), 4096));
  constexpr uint32_t kBlocks = 400;
  auto keys = ChainKeys(1, kBlocks);
  auto data = Payload(*store, kBlocks, 1);
  const uint64_t bb = store->BlockBytes();
  for (uint32_t i = 0; i < kBlocks; ++i)
    ASSERT_TRUE(store->Put(1, std::span(&keys[i], 1), std::span(data).subspan(i * bb, bb)).ok());
  const StoreStats st = store->Stats();
  // 1-slot extents while the session is short, then an eighth of it each:
  // about 8 + 8 ln(400 / 8) extents, against 400 / 64 = 7 fixed ones.
  EXPECT_LE(st.ssd.extents, 40u);
  EXPECT_GE(st.ssd.extents, 7u);
  // The open extent's free tail is at most an eighth of the session.
  EXPECT_LE(st.ssd.used_bytes, kBlocks * kSlotBytes * 9 / 8);
  std::vector<std::byte> got;
  ASSERT_EQ(RestoreAll(*store, keys, &got), kBlocks);
  EXPECT_TRUE(got == data);
  // One read per layer per extent at most: few, large ones.
  EXPECT_LE(store->Stats().ssd.read_requests, st.ssd.extents * 5);
}

TEST(StoreSizedTest, SizedExtentsSurviveACleanRestartAndRecoveryClaimsTheirUnits) {
  TempDir dir;
  StoreOptions o = Wide(dir.Sub("ssd"), 512);
  std::map<uint64_t, size_t> sizes;
  {
    auto store = OpenStore(o);
    for (uint64_t s = 1; s <= 30; ++s) {
      sizes[s] = 1 + (s * 7) % 23;
      ASSERT_TRUE(store->Put(s, ChainKeys(s, sizes[s]), Payload(*store, sizes[s], s)).ok());
    }
    ASSERT_TRUE(store->Close().ok());
  }
  auto store = OpenStore(o);
  const StoreStats st = store->Stats();
  uint64_t blocks = 0;
  for (auto [s, n] : sizes) blocks += n;
  EXPECT_EQ(st.recovered_blocks, blocks);
  EXPECT_EQ(st.ssd.used_bytes, blocks * kSlotBytes);  // each extent exactly its put
  for (auto [s, n] : sizes) ASSERT_NO_FATAL_FAILURE(ExpectChain(*store, s, n));
  // New extents go where no recovered one lies.
  for (uint64_t s = 100; s < 110; ++s) ASSERT_TRUE(PutChain(*store, s, s, 5).ok());
  for (auto [s, n] : sizes) ASSERT_NO_FATAL_FAILURE(ExpectChain(*store, s, n));
  for (uint64_t s = 100; s < 110; ++s) ASSERT_NO_FATAL_FAILURE(ExpectChain(*store, s, 5));
}

TEST(StoreSizedTest, ADirectoryOfFixedExtentsKeepsThemWhenReopenedSized) {
  TempDir dir;
  StoreOptions o = Wide(dir.Sub("ssd"), 1024);
  o.sized_extents = false;
  {
    auto store = OpenStore(o);
    ASSERT_TRUE(PutChain(*store, 1, 1, 3).ok());
  }
  o.sized_extents = true;
  auto store = OpenStore(o);
  ASSERT_TRUE(PutChain(*store, 2, 2, 3).ok());
  EXPECT_EQ(store->Stats().ssd.used_bytes, 2 * 64 * kSlotBytes);
  EXPECT_EQ(testing::ManifestVersion(dir.Sub("ssd")), 4u);  // older builds still read it
  ASSERT_NO_FATAL_FAILURE(ExpectChain(*store, 1, 3));
  ASSERT_NO_FATAL_FAILURE(ExpectChain(*store, 2, 3));
}

// Sessions of random sizes through a store a few times smaller than what
// they write: freed runs of every size are reused, the capacity holds, the
// survivors restore their own bytes, and a restart finds the same.
TEST(StoreSizedTest, RandomSessionSizesReuseFreedRunsAndNeverPassTheCapacity) {
  TempDir dir;
  StoreOptions o = Wide(dir.Sub("ssd"), 600);
  o.dram_capacity_bytes = 96 * kSlotBytes;  // DRAM copies of sized extents too
  o.ssd_extent_layer_bytes = 256 << 10;     // up to 16 blocks an extent
  std::map<uint64_t, size_t> sizes;
  std::mt19937 rng(11);
  uint64_t written = 0;
  {
    auto store = OpenStore(o);
    for (uint64_t s = 1; written < 3 * 600; ++s) {
      const size_t n = 1 + rng() % 40;
      ASSERT_TRUE(PutChain(*store, s, s, n).ok()) << s;
      sizes[s] = n;
      written += n;
      const StoreStats st = store->Stats();
      ASSERT_LE(st.ssd.used_bytes, st.ssd.capacity_bytes);
      ASSERT_LE(st.dram.used_bytes, st.dram.capacity_bytes);
      if (s % 7 == 0) {  // an older session comes back: whatever of it is held is its own bytes
        const uint64_t back = 1 + rng() % s;
        std::vector<std::byte> got;
        const uint32_t hit = RestoreAll(*store, ChainKeys(back, sizes[back]), &got);
        auto want = Payload(*store, sizes[back], back);
        ASSERT_TRUE(std::equal(got.begin(), got.end(), want.begin())) << back << " " << hit;
      }
    }
    const StoreStats st = store->Stats();
    EXPECT_GT(st.ssd.evicted_extents, 0u);
    // Space that holds: at least 80% of the SSD bytes allocated hold blocks.
    EXPECT_GE(double(st.ssd.logical_bytes), 0.8 * double(st.ssd.used_bytes));
  }
  auto store = OpenStore(o);
  uint64_t held = 0;
  for (auto [s, n] : sizes) {
    std::vector<std::byte> got;
    const uint32_t hit = RestoreAll(*store, ChainKeys(s, n), &got);
    auto want = Payload(*store, n, s);
    ASSERT_TRUE(std::equal(got.begin(), got.end(), want.begin())) << s;
    held += hit;
  }
  EXPECT_EQ(held, store->Stats().recovered_blocks);
}

}  // namespace
}  // namespace flatkv
