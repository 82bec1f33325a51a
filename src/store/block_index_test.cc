#include "store/block_index.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>
#include <vector>

namespace flatkv {
namespace {

using Ref = BlockIndex::Ref;

// The keys the index resolves refs against: slot `slot` of "extent"
// `handle`, as the store's extents hold them.
struct Keys {
  std::vector<std::vector<BlockKey>> extents;
  const BlockKey& operator()(Ref r) const { return extents.at(r.handle).at(r.slot); }
  Ref Add(uint32_t handle, const BlockKey& k) {
    if (extents.size() <= handle) extents.resize(handle + 1);
    extents[handle].push_back(k);
    return Ref{handle, static_cast<uint32_t>(extents[handle].size() - 1)};
  }
};

BlockKey RandomKey(std::mt19937_64& rng) { return BlockKey{rng(), rng()}; }

TEST(BlockIndexTest, InsertFindErase) {
  Keys keys;
  BlockIndex index;
  std::mt19937_64 rng(1);
  const BlockKey a = RandomKey(rng), b = RandomKey(rng);
  const Ref ra = keys.Add(3, a), rb = keys.Add(7, b);
  EXPECT_FALSE(index.Find(a, keys).has_value());
  index.Insert(a, ra, keys);
  index.Insert(b, rb, keys);
  EXPECT_EQ(index.size(), 2u);
  ASSERT_TRUE(index.Find(a, keys).has_value());
  EXPECT_EQ(*index.Find(a, keys), ra);
  EXPECT_EQ(*index.Find(b, keys), rb);
  EXPECT_FALSE(index.Erase(a, rb, keys));  // a maps to ra, not rb
  EXPECT_TRUE(index.Contains(a, keys));
  EXPECT_TRUE(index.Erase(a, ra, keys));
  EXPECT_FALSE(index.Erase(a, ra, keys));
  EXPECT_FALSE(index.Contains(a, keys));
  EXPECT_EQ(*index.Find(b, keys), rb);
  EXPECT_EQ(index.size(), 1u);
}

TEST(BlockIndexTest, LargestHandleAndSlotRoundTrip) {
  Keys keys;
  BlockIndex index;
  const BlockKey k{1, 2};
  keys.extents.resize(1);
  keys.extents[0].resize(1, k);
  // A resolver that maps the extreme ref to the one stored key.
  const Ref big{BlockIndex::kMaxHandles - 1, BlockIndex::kMaxSlots - 1};
  auto key_of = [&](Ref r) -> BlockKey { return r == big ? k : BlockKey{~0ull, ~0ull}; };
  index.Insert(k, big, key_of);
  ASSERT_TRUE(index.Find(k, key_of).has_value());
  EXPECT_EQ(*index.Find(k, key_of), big);
  EXPECT_TRUE(index.Erase(k, big, key_of));
}

// Random inserts and erases (clusters, backward shifts, growth mid-way)
// against std::unordered_map.
TEST(BlockIndexTest, MatchesReferenceUnderRandomOperations) {
  Keys keys;
  BlockIndex index;
  std::unordered_map<BlockKey, Ref, BlockKeyHash> ref;
  std::vector<BlockKey> live;
  std::mt19937_64 rng(42);
  for (int op = 0; op < 300'000; ++op) {
    const bool insert = live.empty() || rng() % 100 < 65;
    if (insert) {
      const BlockKey k = RandomKey(rng);
      const Ref r = keys.Add(static_cast<uint32_t>(rng() % 97), k);
      ASSERT_FALSE(index.Contains(k, keys));
      index.Insert(k, r, keys);
      ref[k] = r;
      live.push_back(k);
    } else {
      const size_t at = rng() % live.size();
      const BlockKey k = live[at];
      live[at] = live.back();
      live.pop_back();
      ASSERT_TRUE(index.Erase(k, ref.at(k), keys));
      ref.erase(k);
      ASSERT_FALSE(index.Contains(k, keys));
    }
    if (op % 1024 == 0) {  // some of these fall inside migrations
      ASSERT_EQ(index.size(), ref.size());
      for (const auto& [k, r] : ref) {
        auto got = index.Find(k, keys);
        ASSERT_TRUE(got.has_value()) << "op " << op;
        ASSERT_EQ(*got, r);
      }
    }
  }
  for (const auto& [k, r] : ref) ASSERT_EQ(index.Find(k, keys).value(), r);
  // Unknown keys miss.
  for (int i = 0; i < 10'000; ++i) ASSERT_FALSE(index.Contains(RandomKey(rng), keys));
}

// A small table at its load limit: long clusters, every key erased in turn
// from the middle of them, the rest still found after each erase.
TEST(BlockIndexTest, BackwardShiftKeepsClustersFindable) {
  Keys keys;
  BlockIndex index;
  std::mt19937_64 rng(7);
  std::vector<BlockKey> ks;
  for (int i = 0; i < 51; ++i) {  // 51 of 64 buckets: just under 4/5
    ks.push_back(RandomKey(rng));
    index.Insert(ks.back(), keys.Add(0, ks.back()), keys);
  }
  ASSERT_EQ(index.capacity(), BlockIndex::kMinCapacity);
  for (size_t e = 0; e < ks.size(); ++e) {
    ASSERT_TRUE(index.Erase(ks[e], Ref{0, static_cast<uint32_t>(e)}, keys));
    for (size_t i = e + 1; i < ks.size(); ++i) ASSERT_EQ(index.Find(ks[i], keys).value().slot, i) << e;
  }
  EXPECT_EQ(index.size(), 0u);
}

// Growth never stalls an insert: no insert moves more than kMigrateStep
// entries, a migration ends before the table grows again, and keys stay
// found throughout (in the new table or the retiring one).
TEST(BlockIndexTest, GrowthIsIncremental) {
  Keys keys;
  BlockIndex index;
  std::mt19937_64 rng(9);
  std::vector<BlockKey> ks;
  uint32_t max_moved = 0, growths = 0;
  uint64_t migrating_inserts = 0, moved_total = 0;
  for (int i = 0; i < 1'000'000; ++i) {
    const bool was_migrating = index.migrating();
    const uint64_t cap = index.capacity();
    ks.push_back(RandomKey(rng));
    index.Insert(ks.back(), keys.Add(static_cast<uint32_t>(i % 1000), ks.back()), keys);
    max_moved = std::max(max_moved, index.last_moved());
    moved_total += index.last_moved();
    if (index.capacity() != cap) {
      ++growths;
      ASSERT_FALSE(was_migrating) << "grew again at insert " << i << " before the last migration ended";
      ASSERT_EQ(index.capacity(), cap == 0 ? BlockIndex::kMinCapacity : 2 * cap);
    }
    if (index.migrating()) {
      ++migrating_inserts;
      if (migrating_inserts % 997 == 0) {  // mid-migration: old and new keys alike
        for (size_t j = 0; j < ks.size(); j += ks.size() / 64 + 1) ASSERT_TRUE(index.Contains(ks[j], keys)) << i;
      }
    }
  }
  EXPECT_LE(max_moved, BlockIndex::kMigrateStep);
  EXPECT_GE(growths, 14u);  // 64 -> 2^21 buckets
  EXPECT_GT(migrating_inserts, 0u);
  // Every entry that lived in a retiring table was moved once, a few at a time.
  EXPECT_GT(moved_total, ks.size() / 2);
  for (const BlockKey& k : ks) ASSERT_TRUE(index.Contains(k, keys));
  // Compact: at most 8 bytes / (2/5 load) per entry in the tables once no
  // migration runs (and at most 3x that while one does).
  if (!index.migrating()) {
    EXPECT_LE(index.MemoryBytes(), 20 * ks.size());
  }
  EXPECT_LE(index.MemoryBytes(), 60 * ks.size());
}

}  // namespace
}  // namespace flatkv
