#include "media/range_allocator.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace flatkv {
namespace {

TEST(RangeAllocatorTest, FillsInOrderAndNeverCrossesABoundary) {
  RangeAllocator a(25, 10);  // segments [0,10) [10,20) [20,25)
  EXPECT_EQ(a.Allocate(4), 0u);
  EXPECT_EQ(a.Allocate(4), 4u);
  EXPECT_EQ(a.Allocate(4), 10u);  // 8..9 stay free: a run never crosses 10
  EXPECT_EQ(a.Allocate(2), 8u);   // and are the best fit for a run of 2
  EXPECT_EQ(a.largest_free(), 6u);
  EXPECT_EQ(a.Allocate(6), 14u);
  EXPECT_FALSE(a.Allocate(6).has_value());  // only 5 left, in the last segment
  EXPECT_EQ(a.Allocate(5), 20u);
  EXPECT_EQ(a.used(), 25u);
  EXPECT_EQ(a.runs(), 6u);
  EXPECT_FALSE(a.Allocate(1).has_value());
  EXPECT_FALSE(a.Allocate(11).has_value());
}

TEST(RangeAllocatorTest, FreedRunsCoalesceWithinASegmentAndAreReusedBestFitFirst) {
  RangeAllocator a(20, 10);
  for (int i = 0; i < 10; ++i) ASSERT_EQ(a.Allocate(2), uint64_t(2 * i));
  a.Release(4, 2);
  a.Release(8, 2);
  a.Release(10, 2);  // adjacent to 8..9 but in the next segment: not merged
  EXPECT_EQ(a.largest_free(), 2u);
  a.Release(6, 2);  // 4..9 now one run
  EXPECT_EQ(a.largest_free(), 6u);
  EXPECT_EQ(a.Allocate(2), 10u);  // the best fit is the run of 2, not the run of 6
  EXPECT_EQ(a.Allocate(6), 4u);
  EXPECT_EQ(a.free(), 0u);
}

TEST(RangeAllocatorTest, ClaimTakesRunsAnywhereAndRefusesOverlaps) {
  RangeAllocator a(40, 10);
  EXPECT_TRUE(a.Claim(23, 3));
  EXPECT_TRUE(a.Claim(5, 2));  // below the frontier: split out of a free run
  EXPECT_FALSE(a.Claim(6, 1));
  EXPECT_FALSE(a.Claim(24, 1));
  EXPECT_FALSE(a.Claim(8, 3));   // crosses 10
  EXPECT_FALSE(a.Claim(38, 3));  // past the capacity
  EXPECT_EQ(a.used(), 5u);
  // What lies between is free, a run per segment: a run of 10 fits only at 10.
  EXPECT_EQ(a.Allocate(10), 10u);
  EXPECT_EQ(a.Allocate(5), 0u);
  EXPECT_EQ(a.Allocate(3), 7u);
}

// Against a unit-by-unit model: random allocations and releases never
// overlap, stay within a segment, and keep used() exact.
TEST(RangeAllocatorTest, MatchesAUnitMapUnderRandomUse) {
  constexpr uint64_t kUnits = 1000, kBoundary = 64;
  RangeAllocator a(kUnits, kBoundary);
  std::vector<int> owner(kUnits, -1);
  std::vector<std::pair<uint64_t, uint64_t>> live;
  std::mt19937 rng(3);
  uint64_t used = 0;
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      const uint64_t n = 1 + rng() % 20;
      auto got = a.Allocate(n);
      if (!got) {
        EXPECT_LT(a.largest_free(), n);
        continue;
      }
      ASSERT_EQ(*got / kBoundary, (*got + n - 1) / kBoundary);
      for (uint64_t u = *got; u < *got + n; ++u) {
        ASSERT_EQ(owner[u], -1) << u;
        owner[u] = step;
      }
      live.push_back({*got, n});
      used += n;
    } else {
      const size_t i = rng() % live.size();
      auto [start, n] = live[i];
      for (uint64_t u = start; u < start + n; ++u) owner[u] = -1;
      a.Release(start, n);
      live.erase(live.begin() + i);
      used -= n;
    }
    ASSERT_EQ(a.used(), used);
    ASSERT_EQ(a.runs(), live.size());
  }
}

}  // namespace
}  // namespace flatkv
