// TruncateSession (an agent rewrites its history) and Retain (a chain kept
// from eviction for a while): what goes, what stays, and that both hold
// across a restart.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>

#include "flatkv/store.h"
#include "testing/test_util.h"

namespace flatkv {
namespace {

using namespace std::chrono_literals;
using namespace flatkv::testing;

// A count, or 99999 for an error (so that a failure shows as a mismatch).
uint32_t Or(const Result<uint32_t>& r) { return r.ok() ? *r : 99999u; }

// The first `keep` keys of chain 1, then `tail` keys of chain `other`.
std::vector<BlockKey> Rewritten(size_t keep, uint64_t other, size_t tail) {
  std::vector<BlockKey> keys = ChainKeys(1, keep);
  for (const BlockKey& k : ChainKeys(other, tail)) keys.push_back(k);
  return keys;
}

TEST(StoreSessionsTest, TruncateReleasesTheTailAndThePutGoesOnFromTheCut) {
  TempDir dir;
  OnBothTiers(dir, 16, 64, [&](Store& store, bool ssd) {
    ASSERT_TRUE(PutChain(store, 1, 1, 12).ok());
    auto released = store.TruncateSession(1, 6);
    ASSERT_TRUE(released.ok()) << released.status().ToString();
    EXPECT_EQ(*released, 6u) << ssd;
    EXPECT_EQ(store.Match(ChainKeys(1, 12)), 6u);
    EXPECT_TRUE(RestoresChain(store, 1, 6));
    EXPECT_EQ(store.Stats().truncated_blocks, 6u);
    // The agent's new history: the kept prefix (deduplicated) and a new tail.
    const auto keys = Rewritten(6, 9, 4);
    PutResult result;
    PutOptions po;
    po.result = &result;
    ASSERT_TRUE(store.Put(1, keys, Payload(store, 10, 1), po).ok());
    EXPECT_EQ(result.dedup_blocks, 6u);
    EXPECT_EQ(store.Match(keys), 10u);
    released = store.TruncateSession(1, 8);
    ASSERT_TRUE(released.ok());
    EXPECT_EQ(*released, 2u);
    EXPECT_EQ(store.Match(keys), 8u);
    // Keeping more than it has releases nothing; keeping none, everything.
    EXPECT_EQ(Or(store.TruncateSession(1, 100)), 0u);
    EXPECT_EQ(Or(store.TruncateSession(1, 0)), 8u);
    EXPECT_EQ(store.Match(keys), 0u);
    EXPECT_EQ(store.TruncateSession(1, 0).status().code(), Code::kNotFound);
    EXPECT_EQ(HeldExtents(store), 0u);
  });
}

TEST(StoreSessionsTest, TruncateKeepsBlocksAnotherSessionReferences) {
  TempDir dir;
  auto store = OpenStore(SmallOptions(dir.Sub("ssd"), 8, 64));
  // Session 2 continues session 1's 8 blocks with 4 of its own.
  ASSERT_TRUE(PutChain(*store, 1, 1, 8).ok());
  ASSERT_TRUE(PutChain(*store, 2, 1, 12).ok());
  // Session 1's blocks are referenced by session 2: they stay.
  EXPECT_EQ(Or(store->TruncateSession(1, 2)), 0u);
  EXPECT_EQ(store->Match(ChainKeys(1, 12)), 12u);
  // Session 2's own tail (positions 8..11) goes; its references stay.
  EXPECT_EQ(Or(store->TruncateSession(2, 8)), 4u);
  EXPECT_EQ(store->Match(ChainKeys(1, 12)), 8u);
  // Cutting session 2 at 4 drops its reference to session 1's second
  // extent (blocks 4..7), which session 1 may then release.
  EXPECT_EQ(Or(store->TruncateSession(2, 4)), 0u);
  EXPECT_EQ(Or(store->TruncateSession(1, 4)), 4u);
  EXPECT_EQ(store->Match(ChainKeys(1, 8)), 4u);
  EXPECT_TRUE(RestoresChain(*store, 1, 4));
}

TEST(StoreSessionsTest, TruncationAndPositionsSurviveARestart) {
  TempDir dir;
  const StoreOptions o = SmallOptions(dir.Sub("ssd"), 8, 64);
  for (bool clean : {true, false}) {
    std::filesystem::remove_all(dir.Sub("ssd"));
    std::filesystem::remove_all(dir.Sub("crash"));
    StoreOptions reopen = o;
    {
      auto store = OpenStore(o);
      ASSERT_TRUE(PutChain(*store, 1, 1, 10).ok());
      // A second session starting from session 1's first 2 blocks (shared),
      // so its own blocks begin at position 2.
      ASSERT_TRUE(store->Put(2, Rewritten(2, 7, 6), Payload(*store, 8, 2)).ok());
      ASSERT_EQ(Or(store->TruncateSession(1, 5)), 5u);
      if (!clean) {
        // What a kill -9 leaves: the log as appended, never closed.
        std::filesystem::copy(dir.Sub("ssd"), dir.Sub("crash"), std::filesystem::copy_options::recursive);
        reopen.ssd_dirs = {dir.Sub("crash")};
      }
    }
    auto store = OpenStore(reopen);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->Match(ChainKeys(1, 10)), 5u) << clean;
    EXPECT_EQ(store->Match(Rewritten(2, 7, 6)), 8u) << clean;
    // Positions came back from the log: session 2's own blocks sit at 2..7.
    EXPECT_EQ(Or(store->TruncateSession(2, 5)), 3u) << clean;
    EXPECT_EQ(store->Match(Rewritten(2, 7, 6)), 5u) << clean;
    EXPECT_TRUE(RestoresChain(*store, 1, 5));
  }
}

TEST(StoreSessionsTest, RetainedExtentsAreNotEvictedUntilTheirTtlEnds) {
  auto now = std::chrono::steady_clock::now();
  StoreOptions o = SmallOptions("", 8, 0);  // DRAM only: 8 extents of 4 blocks
  o.clock = [&] { return now; };
  auto store = OpenStore(o);
  ASSERT_TRUE(PutChain(*store, 1, 1, 4).ok());
  EXPECT_EQ(Or(store->Retain(ChainKeys(1, 6), 10s)), 4u);  // the stored prefix
  EXPECT_EQ(store->Stats().retained_extents, 1u);
  // Other sessions fill DRAM many times over: session 1 stays.
  for (uint64_t s = 2; s < 30; ++s) {
    now += 100ms;
    ASSERT_TRUE(PutChain(*store, s, s, 4).ok()) << s;
  }
  EXPECT_EQ(store->Match(ChainKeys(1, 4)), 4u);
  EXPECT_GT(store->Stats().dram.evicted_extents, 0u);
  // Its ttl over, it is evicted like any other idle session.
  now += 10s;
  EXPECT_EQ(store->Stats().retained_extents, 0u);
  for (uint64_t s = 30; s < 40; ++s) ASSERT_TRUE(PutChain(*store, s, s, 4).ok());
  EXPECT_EQ(store->Match(ChainKeys(1, 4)), 0u);
}

TEST(StoreSessionsTest, RetainKeepsDramCopiesAndStopsAtHalfAMedium) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 4, 64);  // 4 DRAM extents: at most 2 retained
  auto store = OpenStore(o);
  ASSERT_TRUE(PutChain(*store, 1, 1, 4).ok());
  ASSERT_EQ(store->Stats().dram.extents, 1u);  // its DRAM copy
  EXPECT_EQ(Or(store->Retain(ChainKeys(1, 4), 1h)), 4u);
  for (uint64_t s = 2; s < 12; ++s) ASSERT_TRUE(PutChain(*store, s, s, 4).ok());
  const uint64_t read_before = store->Stats().ssd.bytes_read;
  EXPECT_TRUE(RestoresChain(*store, 1, 4));
  EXPECT_EQ(store->Stats().ssd.bytes_read, read_before);  // served from its DRAM copy
  // A second retained copy fits; a third would pass half of DRAM.
  EXPECT_EQ(Or(store->Retain(ChainKeys(11, 4), 1h)), 4u);
  ASSERT_TRUE(PutChain(*store, 12, 12, 4).ok());
  EXPECT_EQ(Or(store->Retain(ChainKeys(12, 4), 1h)), 0u);
  EXPECT_EQ(store->Stats().retain_refused_blocks, 4u);
  // Released, the first frees its place.
  EXPECT_EQ(Or(store->Retain(ChainKeys(1, 4), 0ms)), 0u);
  EXPECT_EQ(Or(store->Retain(ChainKeys(12, 4), 1h)), 4u);
  EXPECT_EQ(store->Retain(ChainKeys(1, 4), -1ms).status().code(), Code::kInvalidArgument);
}

// DRAM is shared fairly between tenants: a tenant over an equal share
// gives up its copies first, even when another tenant's are older.
TEST(StoreTenantsTest, CopiesAreReclaimedFromTenantsOverTheirShareFirst) {
  TempDir dir;
  for (bool fair : {true, false}) {
    std::filesystem::remove_all(dir.Sub("ssd"));
    auto store = OpenStore(SmallOptions(dir.Sub("ssd"), 8, 64));  // 8 DRAM copies of one extent each
    auto put = [&](uint64_t session, uint32_t tenant) {
      PutOptions po;
      po.tenant = fair ? tenant : 0;
      ASSERT_TRUE(store->Put(session, ChainKeys(session, 4), Payload(*store, 4, session), po).ok());
    };
    put(100, 2);  // tenant 2's two sessions, the least recently used
    put(101, 2);
    for (uint64_t s = 1; s <= 7; ++s) put(s, 1);  // tenant 1 takes the rest, then more
    const uint64_t eb = store->Stats().dram.used_bytes / store->Stats().dram.extents;
    const uint64_t read_before = store->Stats().ssd.bytes_read;
    std::vector<std::byte> got;
    EXPECT_EQ(RestoreAll(*store, ChainKeys(100, 4), &got), 4u);
    if (fair) {
      EXPECT_EQ(store->Stats().ssd.bytes_read, read_before) << "tenant 2's copy must stay";
      EXPECT_EQ(store->Stats().tenant_dram_bytes.at(2), 2 * eb);
      EXPECT_EQ(store->Stats().tenant_dram_bytes.at(1), 6 * eb);
      EXPECT_EQ(store->Match(ChainKeys(1, 4)), 4u);  // its blocks stay on SSD
    } else {
      EXPECT_GT(store->Stats().ssd.bytes_read, read_before) << "without tenants, plain LRU takes the oldest copy";
    }
  }
}

}  // namespace
}  // namespace flatkv
