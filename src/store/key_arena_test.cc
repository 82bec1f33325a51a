#include "store/key_arena.h"

#include <gtest/gtest.h>

#include <vector>

#include "flatkv/keys.h"

namespace flatkv {
namespace {

// Arrays of every size class (and below and above them) keep what was
// written, are 2 MiB-chunk carved from 4 KiB on, count in UsedBytes while
// held, and a freed array of a class is handed out again.
TEST(KeyArenaTest, ArraysOfEveryClassHoldTheirKeysAndAreRecycled) {
  const uint64_t used0 = KeyArena::UsedBytes();
  std::vector<std::vector<BlockKey, KeyArenaAllocator<BlockKey>>> arrays;
  uint64_t want = 0;
  for (size_t n : {1u, 255u, 256u, 257u, 1000u, 4096u, 8192u, 131072u, 131073u}) {
    arrays.emplace_back(n);
    for (size_t i = 0; i < n; ++i) arrays.back()[i] = BlockKey{n, i};
    const size_t bytes = n * sizeof(BlockKey);
    if (bytes >= KeyArena::kMinBytes) {
      size_t c = KeyArena::kMinBytes;
      while (c < bytes) c *= 2;
      want += bytes > KeyArena::kChunkBytes ? (bytes + KeyArena::kChunkBytes - 1) / KeyArena::kChunkBytes * KeyArena::kChunkBytes : c;
      if (bytes <= KeyArena::kChunkBytes) {
        EXPECT_EQ(reinterpret_cast<uintptr_t>(arrays.back().data()) % c, 0u) << n;  // carved at class alignment
      }
    }
  }
  EXPECT_EQ(KeyArena::UsedBytes() - used0, want);
  for (const auto& a : arrays)
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], (BlockKey{a.size(), i}));
  const BlockKey* freed = arrays[4].data();  // 1000 keys: the 16 KiB class
  decltype(arrays)::value_type().swap(arrays[4]);
  std::vector<BlockKey, KeyArenaAllocator<BlockKey>> again(1024);
  EXPECT_EQ(again.data(), freed);
  arrays.clear();
  decltype(again)().swap(again);
  EXPECT_EQ(KeyArena::UsedBytes(), used0);
  EXPECT_GT(KeyArena::MappedBytes(), 0u);
}

}  // namespace
}  // namespace flatkv
