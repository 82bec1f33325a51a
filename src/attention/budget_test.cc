// Budget allocators: every one spends exactly the kvpress budget, respects
// its floors and caps, and moves budget the way its paper says.
#include "attention/budget.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace flatkv::attention {
namespace {

// `layers` layers of `heads` heads; head h's scores are concentrated when
// `peaky[h]` (one dominant token), flat otherwise.
std::vector<HeadScores> MakeScores(int layers, int heads, uint32_t n, const std::vector<bool>& peaky, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.5f, 1.0f);
  std::vector<HeadScores> out(layers);
  for (auto& s : out) {
    s.n_kv_heads = heads;
    s.n_tokens = n;
    s.s.resize(size_t(heads) * n);
    for (int h = 0; h < heads; ++h)
      for (uint32_t t = 0; t < n; ++t) s.head(h)[t] = peaky[h] ? (t == 3 ? 50.0f : 0.01f * u(rng)) : u(rng);
  }
  return out;
}

uint64_t Kept(const Selection& sel) {
  uint64_t n = 0;
  for (auto& l : sel)
    for (auto& h : l) n += h.size();
  return n;
}

TEST(AttentionBudgetTest, KeepPerHeadFollowsKvpress) {
  EXPECT_EQ(KeepPerHead(100, 0.5), 50u);
  EXPECT_EQ(KeepPerHead(101, 0.5), 50u);
  EXPECT_EQ(KeepPerHead(100, 0.0), 100u);
  EXPECT_EQ(KeepPerHead(10, 0.99), 1u);
}

TEST(AttentionBudgetTest, EveryAllocatorSpendsTheBudgetExactly) {
  const std::vector<bool> peaky = {true, false, false, true};
  for (uint32_t n : {7u, 64u, 129u})
    for (double ratio : {0.0, 0.25, 0.5, 0.9})
      for (Allocator a : {Allocator::kUniform, Allocator::kPyramid, Allocator::kAdaKv, Allocator::kChampion,
                          Allocator::kDuo}) {
        auto scores = MakeScores(5, 4, n, peaky, n);
        BudgetOptions o;
        o.ratio = ratio;
        auto sel = Allocate(a, scores, o);
        ASSERT_TRUE(sel.ok()) << sel.status().ToString();
        EXPECT_EQ(Kept(*sel), uint64_t{KeepPerHead(n, ratio)} * 5 * 4) << AllocatorName(a) << " n=" << n << " r=" << ratio;
        for (auto& l : *sel)
          for (auto& h : l) {
            EXPECT_TRUE(std::is_sorted(h.begin(), h.end()));
            EXPECT_TRUE(std::adjacent_find(h.begin(), h.end()) == h.end());
            if (!h.empty()) {
              EXPECT_LT(h.back(), n);
            }
          }
      }
}

TEST(AttentionBudgetTest, PyramidShrinksWithDepth) {
  auto scores = MakeScores(5, 2, 200, {false, false}, 1);
  BudgetOptions o;
  o.ratio = 0.5;
  auto sel = Allocate(Allocator::kPyramid, scores, o);
  ASSERT_TRUE(sel.ok());
  for (int l = 1; l < 5; ++l) EXPECT_LT((*sel)[l][0].size(), (*sel)[l - 1][0].size());
  EXPECT_LE((*sel)[4][0].size(), 6u);  // about k / beta = 100 / 20 (floors of 1 come first)
  EXPECT_GE((*sel)[4][0].size(), 5u);
}

// kvpress's PyramidKVPress.get_layer_budget with window_size 64: n = 400 at
// 25% kept (k = 100): bottom k/20 = 5 < 64, uniform; n = 4000 at 25%
// (k = 1000): bottom 50 < 64, uniform; n = 2000 at 50% (k = 1000): top
// 1950 >= 2000 - 64, so it is capped at 1936 and the bottom raised to 64: a
// pyramid from 1936 to 64 (the 2,047-token prompts at 50% are this case).
TEST(AttentionBudgetTest, PyramidFollowsKvpresssWindowRule) {
  BudgetOptions o;
  o.pyramid_window = 64;
  auto uniform_everywhere = [](const Selection& sel, size_t k) {
    for (auto& l : sel)
      for (auto& h : l)
        if (h.size() != k) return false;
    return true;
  };
  o.ratio = 0.75;
  auto small = Allocate(Allocator::kPyramid, MakeScores(5, 2, 400, {false, false}, 3), o);
  ASSERT_TRUE(small.ok());
  EXPECT_TRUE(uniform_everywhere(*small, 100));
  auto flat = Allocate(Allocator::kPyramid, MakeScores(5, 2, 4000, {false, false}, 4), o);
  ASSERT_TRUE(flat.ok());
  EXPECT_TRUE(uniform_everywhere(*flat, 1000));
  o.ratio = 0.5;
  auto capped = Allocate(Allocator::kPyramid, MakeScores(5, 2, 2000, {false, false}, 5), o);
  ASSERT_TRUE(capped.ok());
  EXPECT_NEAR(double((*capped)[0][0].size()), 1936, 1);
  EXPECT_NEAR(double((*capped)[4][0].size()), 64, 1);
  EXPECT_EQ(Kept(*capped), uint64_t{1000} * 5 * 2);
  // 2,047 tokens at 50%: kvpress's mean is 1023.5, not 1023, so the bottom is
  // 2047 - 1983 = 64 and the pyramid stands (with the floored mean it would be 63: uniform).
  auto edge = Allocate(Allocator::kPyramid, MakeScores(5, 2, 2047, {false, false}, 6), o);
  ASSERT_TRUE(edge.ok());
  EXPECT_NEAR(double((*edge)[0][0].size()), 1983, 3);  // scaled to the floored total (1023 a head)
  EXPECT_NEAR(double((*edge)[4][0].size()), 64, 1);
  o.pyramid_window = 0;  // flatkv's own rule: no cap, no fallback
  auto own = Allocate(Allocator::kPyramid, MakeScores(5, 2, 2000, {false, false}, 5), o);
  ASSERT_TRUE(own.ok());
  EXPECT_NEAR(double((*own)[0][0].size()), 1950, 1);
  EXPECT_NEAR(double((*own)[4][0].size()), 50, 1);
}

TEST(AttentionBudgetTest, AdaKvSafeguardAndGlobalTopK) {
  auto scores = MakeScores(1, 2, 100, {true, false}, 2);
  BudgetOptions o;
  o.ratio = 0.8;  // k = 20 per head, 40 per layer
  auto sel = Allocate(Allocator::kAdaKv, scores, o);
  ASSERT_TRUE(sel.ok());
  EXPECT_GE((*sel)[0][0].size(), 10u);  // alpha * k
  EXPECT_GE((*sel)[0][1].size(), 10u);
  EXPECT_GT((*sel)[0][1].size(), (*sel)[0][0].size());  // the flat head's scores are larger
}

TEST(AttentionBudgetTest, ChampionFavoursDispersedHeadsAndFloorsAbnormalOnes) {
  auto scores = MakeScores(1, 3, 100, {true, false, false}, 3);
  // Head 2: moderately concentrated (a few tokens dominate).
  for (uint32_t t = 0; t < 100; ++t) scores[0].head(2)[t] = t < 10 ? 5.0f : 0.5f;
  BudgetOptions o;
  o.ratio = 0.7;  // k = 30
  auto sel = Allocate(Allocator::kChampion, scores, o);
  ASSERT_TRUE(sel.ok());
  EXPECT_EQ((*sel)[0][0].size(), 6u);  // abnormal (peak > 0.9): the floor, ceil(0.2 * 30)
  EXPECT_GT((*sel)[0][1].size(), (*sel)[0][2].size());
  EXPECT_EQ((*sel)[0][0].size() + (*sel)[0][1].size() + (*sel)[0][2].size(), 90u);
}

TEST(AttentionBudgetTest, DuoMakesSinkHeadsStreamingAndGivesTheRestToRetrievalHeads) {
  auto scores = MakeScores(1, 4, 400, {false, false, false, false}, 5);
  for (int h : {1, 3})  // sink-heavy heads
    for (uint32_t t = 0; t < 4; ++t) scores[0].head(h)[t] = 1000.0f;
  BudgetOptions o;
  o.ratio = 0.5;  // k = 200, layer budget 800
  auto sel = Allocate(Allocator::kDuo, scores, o);
  ASSERT_TRUE(sel.ok());
  for (int h : {1, 3}) {
    const auto& v = (*sel)[0][h];
    ASSERT_EQ(v.size(), 64u);
    EXPECT_EQ(v[3], 3u);
    EXPECT_EQ(v[4], 340u);  // then the 60 most recent
    EXPECT_EQ(v.back(), 399u);
  }
  EXPECT_EQ((*sel)[0][0].size(), 336u);  // (800 - 128) / 2
  EXPECT_EQ((*sel)[0][2].size(), 336u);
}

TEST(AttentionBudgetTest, DistributeRespectsFloorsAndCaps) {
  std::vector<double> w = {1, 1, 8};
  std::vector<uint32_t> floors = {2, 0, 0}, caps = {10, 10, 5};
  auto c = Distribute(17, w, floors, caps);
  EXPECT_EQ(c[0] + c[1] + c[2], 17u);
  EXPECT_EQ(c[2], 5u);
  EXPECT_GE(c[0], 2u);
  for (int i = 0; i < 3; ++i) EXPECT_LE(c[i], caps[i]);
}

TEST(AttentionBudgetTest, TopKBreaksTiesTowardLaterTokens) {
  std::vector<float> s = {1, 3, 3, 0, 3, NAN};
  EXPECT_EQ(TopK(s.data(), 6, 2), (std::vector<uint32_t>{2, 4}));
  EXPECT_EQ(TopK(s.data(), 6, 6).size(), 6u);
}

TEST(AttentionBudgetTest, RejectsBadRatio) {
  auto scores = MakeScores(1, 1, 10, {false}, 4);
  BudgetOptions o;
  o.ratio = 1.0;
  EXPECT_FALSE(Allocate(Allocator::kUniform, scores, o).ok());
  o.ratio = -0.1;
  EXPECT_FALSE(Allocate(Allocator::kUniform, scores, o).ok());
  EXPECT_FALSE(ParseAllocator("fancy").ok());
}

}  // namespace
}  // namespace flatkv::attention
