// SSD homes and DRAM copies: copies serve restores, are reclaimed least
// recently used session first without losing a block, are re-admitted on
// restore; put hints; DRAM-only blocks; the SSD write buffer's
// back-pressure and what a restore may see while an SSD write is in flight.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "flatkv/store.h"
#include "io/fault_injection.h"
#include "testing/test_util.h"
#include "testing/zero_run_codec.h"

namespace flatkv {
namespace {

using namespace flatkv::testing;

// Restores `keys` and counts the hit blocks each medium served.
struct Served {
  uint32_t blocks = 0;
  uint64_t dram = 0, ssd = 0;
  bool right = false;
};
Served RestoreFrom(Store& store, const std::vector<BlockKey>& keys, const std::vector<std::byte>& want) {
  const StoreStats before = store.Stats();
  std::vector<std::byte> got;
  Served s;
  s.blocks = RestoreAll(store, keys, &got);
  const StoreStats after = store.Stats();
  s.dram = after.dram.hit_blocks - before.dram.hit_blocks;
  s.ssd = after.ssd.hit_blocks - before.ssd.hit_blocks;
  s.right = std::equal(got.begin(), got.end(), want.begin());
  return s;
}

TEST(StorePlacementTest, EveryBlockHasAnSsdHomeAndItsDramCopyServesRestores) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 8, 64);
  auto store = OpenStore(o);
  PutResult result;
  ASSERT_TRUE(PutChain(*store, 1, 1, 8, &result).ok());
  EXPECT_EQ(result.stored_blocks, 8u);
  EXPECT_EQ(result.dram_only_blocks, 0u);
  StoreStats st = store->Stats();
  EXPECT_EQ(st.ssd.blocks, 8u);  // every block's home
  EXPECT_EQ(st.dram.blocks, 8u);  // and a copy of both extents (the session's share is 2 extents)
  EXPECT_EQ(st.ssd.extents, 2u);
  EXPECT_EQ(st.dram.extents, 2u);
  EXPECT_EQ(st.dram_only_blocks, 0u);
  Served s = RestoreFrom(*store, ChainKeys(1, 8), Payload(*store, 8, 1));
  EXPECT_EQ(s.blocks, 8u);
  EXPECT_TRUE(s.right);
  EXPECT_EQ(s.dram, 8u);
  EXPECT_EQ(s.ssd, 0u);
  auto r = store->StartRestore(ChainKeys(1, 8));
  ASSERT_TRUE(r.ok());
  for (const BlockLocation& loc : r.value()->locations()) EXPECT_EQ(loc.layer0.medium(), Medium::kDram);
  EXPECT_EQ(r.value()->Finish(), 8u);
}

TEST(StorePlacementTest, CopiesAreReclaimedLeastRecentSessionFirstAndBlocksStayOnSsd) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 2, 16);  // DRAM: two extents
  o.session_dram_share_bytes = 1ull << 40;
  o.readmit_on_restore = false;
  auto store = OpenStore(o);
  ASSERT_TRUE(PutChain(*store, 1, 1, 8).ok());  // copies of both its extents
  EXPECT_EQ(store->Stats().dram.blocks, 8u);
  ASSERT_TRUE(PutChain(*store, 2, 2, 4).ok());  // takes session 1's newest copy
  StoreStats st = store->Stats();
  EXPECT_EQ(st.dram.evicted_extents, 1u);
  EXPECT_EQ(st.dram.evicted_blocks, 4u);
  EXPECT_EQ(st.dram.extents, 2u);
  EXPECT_EQ(st.ssd.blocks, 12u);
  // Nothing was lost: session 1's prefix comes from DRAM, the rest from SSD.
  Served s = RestoreFrom(*store, ChainKeys(1, 8), Payload(*store, 8, 1));
  EXPECT_EQ(s.blocks, 8u);
  EXPECT_TRUE(s.right);
  EXPECT_EQ(s.dram, 4u);
  EXPECT_EQ(s.ssd, 4u);
  // Session 1 is now the most recent: the next copy comes out of session 2's.
  ASSERT_TRUE(PutChain(*store, 3, 3, 4).ok());
  s = RestoreFrom(*store, ChainKeys(2, 4), Payload(*store, 4, 2));
  EXPECT_EQ(s.blocks, 4u);
  EXPECT_TRUE(s.right);
  EXPECT_EQ(s.ssd, 4u);
  s = RestoreFrom(*store, ChainKeys(1, 8), Payload(*store, 8, 1));
  EXPECT_EQ(s.dram, 4u);
}

TEST(StorePlacementTest, APutNeverWaitsForDramItGoesWithoutACopy) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 1, 16);
  o.session_dram_share_bytes = 1ull << 40;
  auto store = OpenStore(o);
  ASSERT_TRUE(PutChain(*store, 1, 1, 4).ok());
  auto restore = store->StartRestore(ChainKeys(1, 4));  // pins the only copy
  ASSERT_TRUE(restore.ok());
  ASSERT_TRUE(PutChain(*store, 2, 2, 4).ok());
  EXPECT_EQ(store->Stats().dram.evicted_extents, 0u);
  EXPECT_EQ(restore.value()->Finish(), 4u);
  restore.value().reset();
  Served s = RestoreFrom(*store, ChainKeys(2, 4), Payload(*store, 4, 2));
  EXPECT_EQ(s.blocks, 4u);
  EXPECT_TRUE(s.right);
  EXPECT_EQ(s.ssd, 4u);
}

class StoreReadmitTest : public ::testing::TestWithParam<bool> {};

TEST_P(StoreReadmitTest, ARestoreFromSsdReadmitsTheBlocksAsADramCopy) {
  const bool coded = GetParam();
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 4, 16);
  // Coded, the 8 blocks take three extents (batches pack 4 KiB aligned): let
  // the session's share hold all of DRAM so every one of them gets a copy.
  o.session_dram_share_bytes = 4 * kSmallExtentBytes;
  auto store = OpenStore(o);
  auto data = Payload(*store, 8, 1);
  for (size_t b = 0; b < data.size(); b += 5) data[b] = std::byte{0};  // something for the codec to remove
  PutOptions po;
  po.hint = PutHint::kOneShot;  // SSD homes only
  if (coded) po.codec = std::make_shared<testing::ZeroRunCodec>();
  po.first_block = 0;
  ASSERT_TRUE(store->Put(1, ChainKeys(1, 8), data, po).ok());
  EXPECT_EQ(store->Stats().dram.blocks, 0u);
  Served s = RestoreFrom(*store, ChainKeys(1, 8), data);
  EXPECT_EQ(s.blocks, 8u);
  EXPECT_TRUE(s.right);
  EXPECT_EQ(s.ssd, 8u);
  EXPECT_EQ(store->Stats().readmitted_blocks, 8u);
  EXPECT_EQ(store->Stats().dram.blocks, 8u);
  // The copy serves the next restore, into the window and into caller memory.
  s = RestoreFrom(*store, ChainKeys(1, 8), data);
  EXPECT_EQ(s.blocks, 8u);
  EXPECT_TRUE(s.right);
  EXPECT_EQ(s.dram, 8u);
  EXPECT_EQ(s.ssd, 0u);
  std::vector<std::byte> got;
  EXPECT_EQ(testing::RestoreInto(*store, ChainKeys(1, 8), true, &got), 8u);
  EXPECT_TRUE(got == data);
}

TEST_P(StoreReadmitTest, WithoutReadmitRestoresKeepReadingSsd) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 4, 16);
  o.readmit_on_restore = false;
  auto store = OpenStore(o);
  PutOptions po;
  po.hint = PutHint::kOneShot;
  if (GetParam()) po.codec = std::make_shared<testing::ZeroRunCodec>();
  ASSERT_TRUE(PutChain(*store, 1, 1, 8, nullptr, po).ok());
  for (int i = 0; i < 2; ++i) {
    Served s = RestoreFrom(*store, ChainKeys(1, 8), Payload(*store, 8, 1));
    EXPECT_EQ(s.ssd, 8u);
    EXPECT_TRUE(s.right);
  }
  EXPECT_EQ(store->Stats().readmitted_blocks, 0u);
}

INSTANTIATE_TEST_SUITE_P(RawAndCoded, StoreReadmitTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? std::string("coded") : std::string("raw"); });

TEST(StorePlacementTest, EachPutHintChangesPlacement) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 16, 64);
  o.session_dram_share_bytes = kSmallExtentBytes;  // one extent's copy per session
  auto store = OpenStore(o);
  auto copies = [&] { return store->Stats().dram.extents; };
  ASSERT_TRUE(PutChain(*store, 1, 1, 12).ok());  // kAuto: within the share
  EXPECT_EQ(copies(), 1u);
  ASSERT_TRUE(store->Put(2, ChainKeys(2, 12), Payload(*store, 12, 2), {PutHint::kHot}).ok());  // past it
  EXPECT_EQ(copies(), 4u);
  ASSERT_TRUE(store->Put(3, ChainKeys(3, 12), Payload(*store, 12, 3), {PutHint::kOneShot}).ok());  // none
  EXPECT_EQ(copies(), 4u);
  EXPECT_EQ(store->Stats().ssd.blocks, 36u);
  for (uint64_t c = 1; c <= 3; ++c) {
    Served s = RestoreFrom(*store, ChainKeys(c, 12), Payload(*store, 12, c));
    EXPECT_EQ(s.blocks, 12u) << c;
    EXPECT_TRUE(s.right) << c;
  }
}

TEST(StorePlacementTest, TheDerivedShareIsHalfOfDram) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 8, 64);
  o.session_dram_share_bytes = 0;  // derived: max(one extent, DRAM / 2) = 4 extents
  auto store = OpenStore(o);
  ASSERT_TRUE(PutChain(*store, 1, 1, 24).ok());
  EXPECT_EQ(store->Stats().dram.extents, 4u);
}

TEST(StorePlacementTest, FixedDramPlacementMakesDramOnlyBlocksBesideAnSsd) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 4, 16);
  o.placement = std::make_shared<FixedPlacement>(Medium::kDram);
  auto store = OpenStore(o);
  PutResult result;
  ASSERT_TRUE(PutChain(*store, 1, 1, 4, &result).ok());
  EXPECT_EQ(result.dram_only_blocks, 4u);
  EXPECT_EQ(store->Stats().dram_only_blocks, 4u);
  EXPECT_EQ(store->Stats().ssd.blocks, 0u);
  Served s = RestoreFrom(*store, ChainKeys(1, 4), Payload(*store, 4, 1));
  EXPECT_EQ(s.dram, 4u);
  EXPECT_TRUE(s.right);
}

// While a put's SSD write is held, its DRAM copy already serves restores, a
// put without a copy is not visible at all, and a put beyond the SSD write
// buffer waits for the earlier write.
TEST(StoreDurabilityTest, DramCopiesAreVisibleBeforeTheSsdWriteAndTheBufferBoundsWhatIsInFlight) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 8, 64);
  auto engine = InjectFaults(&o);
  o.sized_extents = false;  // the first puts create every extent the test writes into (a manifest write) before the gate closes
  auto store = OpenStore(o);
  o.ssd_write_buffer_bytes = store->BlockBytes();  // one block in flight
  store.reset();
  store = OpenStore(o);
  auto keys = ChainKeys(1, 4);
  auto data = Payload(*store, 4, 1);
  // Extents are created (a manifest write) before the gate closes.
  ASSERT_TRUE(store->Put(1, {keys.begin(), keys.begin() + 1}, std::span(data).first(store->BlockBytes())).ok());
  ASSERT_TRUE(store->Put(2, ChainKeys(2, 1), Payload(*store, 1, 2), {PutHint::kOneShot}).ok());
  auto wait_for = [](auto done) {
    for (int i = 0; i < 20000 && !done(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return done();
  };

  engine->CloseGate();
  std::thread a([&] {
    EXPECT_TRUE(store->Put(1, {keys.begin() + 1, keys.begin() + 3},
                           std::span(data).subspan(store->BlockBytes(), 2 * store->BlockBytes()))
                    .ok());
  });
  ASSERT_TRUE(wait_for([&] { return engine->held() > 0; }));
  // The put has not returned, and its blocks restore from DRAM already.
  Served s = RestoreFrom(*store, {keys.begin(), keys.begin() + 3}, data);
  EXPECT_EQ(s.blocks, 3u);
  EXPECT_TRUE(s.right);
  EXPECT_EQ(s.ssd, 0u);
  EXPECT_EQ(store->Stats().ssd.blocks, 2u);  // their SSD homes are not written yet
  std::thread b([&] {
    EXPECT_TRUE(store->Put(1, {keys.begin() + 3, keys.end()}, std::span(data).subspan(3 * store->BlockBytes())).ok());
  });
  ASSERT_TRUE(wait_for([&] { return store->Stats().ssd_write_waits > 0; }));  // b waits for a's write
  engine->OpenGate();
  a.join();
  b.join();
  EXPECT_EQ(store->Stats().ssd.blocks, 5u);

  // Without a copy a block is visible only once its SSD write completed.
  engine->CloseGate();
  std::thread c([&] { EXPECT_TRUE(store->Put(2, ChainKeys(2, 2), Payload(*store, 2, 2), {PutHint::kOneShot}).ok()); });
  ASSERT_TRUE(wait_for([&] { return engine->held() > 0; }));
  EXPECT_EQ(store->Match(ChainKeys(2, 2)), 1u);
  engine->OpenGate();
  c.join();
  EXPECT_EQ(store->Match(ChainKeys(2, 2)), 2u);
  s = RestoreFrom(*store, keys, data);
  EXPECT_EQ(s.blocks, 4u);
  EXPECT_TRUE(s.right);
}

TEST(StoreDurabilityTest, AFailedSsdWriteLeavesTheBlocksMissesEvenWithADramCopy) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 8, 64);
  auto engine = InjectFaults(&o);
  auto store = OpenStore(o);
  ASSERT_TRUE(PutChain(*store, 1, 1, 2).ok());
  ASSERT_TRUE(PutChain(*store, 2, 3, 1).ok());  // session 2's extent exists: no manifest write below
  io::FaultRule rule;
  rule.op = io::Op::kWrite;
  rule.count = 1;
  engine->AddRule(rule);
  Status s = PutChain(*store, 2, 2, 2);
  EXPECT_EQ(s.code(), Code::kIoError) << s.ToString();
  EXPECT_EQ(store->Match(ChainKeys(2, 2)), 0u);
  EXPECT_EQ(store->Match(ChainKeys(1, 2)), 2u);  // nothing stored before was lost
  EXPECT_EQ(store->Stats().dram_only_blocks, 0u);
}

// Sessions whose every extent was evicted leave the session map and the
// LRU order (they would otherwise grow without bound), owners and
// sharers alike; a forgotten session can put again.
TEST(StoreEvictionTest, ASessionWhoseExtentsWereAllEvictedIsForgotten) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 2, 4);  // 4 SSD extents of 4 blocks
  auto store = OpenStore(o);
  ASSERT_TRUE(PutChain(*store, 1, 1, 4).ok());
  ASSERT_TRUE(PutChain(*store, 2, 1, 4).ok());  // shares session 1's extent
  EXPECT_EQ(store->Stats().sessions, 2u);
  for (uint64_t s = 10; s < 30; ++s) ASSERT_TRUE(PutChain(*store, s, s, 4).ok());
  StoreStats st = store->Stats();
  EXPECT_EQ(store->Match(ChainKeys(1, 4)), 0u);
  EXPECT_GT(st.ssd.evicted_extents, 0u);
  EXPECT_EQ(st.sessions, 4u) << "one per extent the SSD holds";
  for (uint64_t s = 26; s < 30; ++s) EXPECT_EQ(store->Match(ChainKeys(s, 4)), 4u);
  EXPECT_EQ(store->DropSession(1).code(), Code::kNotFound);
  ASSERT_TRUE(PutChain(*store, 1, 1, 4).ok());
  EXPECT_TRUE(RestoresChain(*store, 1, 4));
  EXPECT_EQ(store->Stats().sessions, 4u);
}

// A session dropped while a restore reads its extent is forgotten when the
// restore lets go of the extent.
TEST(StoreEvictionTest, ADroppedSessionIsForgottenWhenItsLastPinnedExtentIsFreed) {
  TempDir dir;
  auto store = OpenStore(SmallOptions(dir.Sub("ssd"), 2, 8));
  ASSERT_TRUE(PutChain(*store, 1, 1, 4).ok());
  auto restore = store->StartRestore(ChainKeys(1, 4));
  ASSERT_TRUE(restore.ok()) << restore.status().ToString();
  ASSERT_TRUE(store->DropSession(1).ok());
  EXPECT_EQ(store->Stats().sessions, 1u);  // its extent is pinned by the restore
  for (uint32_t l = 0; l < store->options().shape.layers; ++l) {
    ASSERT_TRUE((*restore)->WaitLayer(l).ok());
    (*restore)->ReleaseLayer(l);
  }
  (void)(*restore)->Finish();
  restore->reset();
  EXPECT_EQ(store->Stats().sessions, 0u);
  EXPECT_EQ(store->Match(ChainKeys(1, 4)), 0u);
}

}  // namespace
}  // namespace flatkv
