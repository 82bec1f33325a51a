// Scorers on hand-made layers whose right answer is known.
#include "attention/scoring.h"

#include <gtest/gtest.h>

#include <cmath>

namespace flatkv::attention {
namespace {

// One KV head, head_dim 2, `n` keys along e0 except key `hot` which points
// along e1; queries along e1 with `gain` attend mostly to `hot`.
struct Toy {
  int heads = 2, kv_heads = 1, d = 2;
  uint32_t n;
  std::vector<float> k, v, q;
  std::vector<uint32_t> qpos;
  Toy(uint32_t n_tokens, uint32_t hot, uint32_t queries, float gain) : n(n_tokens) {
    k.assign(size_t(n) * d, 0.0f);
    v.assign(k.size(), 1.0f);
    for (uint32_t t = 0; t < n; ++t) k[t * d] = 1.0f;
    k[hot * d] = 0.0f;
    k[hot * d + 1] = 1.0f;
    q.assign(size_t(heads) * queries * d, 0.0f);
    for (int h = 0; h < heads; ++h)
      for (uint32_t j = 0; j < queries; ++j) q[(h * queries + j) * d + 1] = gain;
    for (uint32_t j = 0; j < queries; ++j) qpos.push_back(n - queries + j);
  }
  LayerKv View() const { return {heads, kv_heads, d, n, k, v, {}, QueryBlock{q, qpos}}; }
};

TEST(AttentionScoringTest, StreamingKeepsSinksThenRecent) {
  Toy toy(20, 7, 4, 5.0f);
  auto s = MakeStreamingScorer(4)->Score(toy.View(), {});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  for (uint32_t t = 0; t < 4; ++t) EXPECT_TRUE(std::isinf(s->head(0)[t]));
  for (uint32_t t = 5; t < 20; ++t) EXPECT_GT(s->head(0)[t], s->head(0)[t - 1]);
}

TEST(AttentionScoringTest, AccumulatedAttentionIsAProbabilityPerQuery) {
  Toy toy(16, 3, 4, 4.0f);
  std::vector<float> acc(16, 0.0f);
  AccumulateAttention(toy.View(), toy.View().recent, acc);
  double sum = 0;
  for (float a : acc) sum += a;
  EXPECT_NEAR(sum, 1.0, 1e-5);  // mean over group and queries of distributions
  for (uint32_t t = 0; t < 16; ++t)
    if (t != 3) {
      EXPECT_GT(acc[3], acc[t]);
    }
}

TEST(AttentionScoringTest, CausalMaskHidesLaterKeys) {
  Toy toy(8, 7, 1, 4.0f);
  toy.qpos = {5};  // the query sits before the hot key
  std::vector<float> acc(8, 0.0f);
  AccumulateAttention(toy.View(), toy.View().recent, acc);
  EXPECT_EQ(acc[6], 0.0f);
  EXPECT_EQ(acc[7], 0.0f);
  EXPECT_NEAR(acc[0], 1.0f / 6, 1e-5);
}

TEST(AttentionScoringTest, SnapKvPoolsAroundTheHotKeyAndKeepsTheWindow) {
  Toy toy(64, 10, 8, 6.0f);
  auto s = MakeSnapKvScorer(8, 7)->Score(toy.View(), {});
  ASSERT_TRUE(s.ok());
  for (uint32_t t = 7; t <= 13; ++t) EXPECT_FLOAT_EQ(s->head(0)[t], s->head(0)[10]);  // pooled neighbourhood
  EXPECT_LT(s->head(0)[20], s->head(0)[10]);
  for (uint32_t t = 56; t < 64; ++t) EXPECT_TRUE(std::isinf(s->head(0)[t]));  // the window
}

// torch.nn.functional.avg_pool1d([1, 2, 3, 4, 5, 6], kernel_size=5, padding=2, stride=1)
// = [1.2, 2.0, 3.0, 4.0, 3.6, 3.0] (count_include_pad: edges divided by 5 too).
TEST(AttentionScoringTest, AvgPoolMatchesTorchAvgPool1dAndLeavesTheTailAlone) {
  HeadScores s;
  s.n_kv_heads = 1;
  s.n_tokens = 8;
  s.s = {1, 2, 3, 4, 5, 6, 100, 200};
  AvgPool(s, 5, 6);
  const float want[] = {1.2f, 2.0f, 3.0f, 4.0f, 3.6f, 3.0f, 100, 200};
  for (int t = 0; t < 8; ++t) EXPECT_NEAR(s.s[t], want[t], 1e-6) << t;
}

// kvpress's SnapKVPress pools only the keys before the window: the key just
// before it is averaged with zeros, not with the window's own attention.
TEST(AttentionScoringTest, SnapKvAveragePoolingIsKvpresssAndKeepsTheWindow) {
  Toy toy(64, 10, 8, 6.0f);
  auto avg = MakeSnapKvScorer(8, 5, Pool::kAvg)->Score(toy.View(), {});
  ASSERT_TRUE(avg.ok());
  std::vector<float> raw(64, 0.0f);
  LayerKv kv = toy.View();
  AccumulateAttention(kv, kv.recent, raw);
  for (uint32_t t = 0; t < 56; ++t) {
    double sum = 0;
    for (int i = int(t) - 2; i <= int(t) + 2; ++i)
      if (i >= 0 && i < 56) sum += raw[i];
    EXPECT_NEAR(avg->head(0)[t], sum / 5, 1e-6) << t;
  }
  for (uint32_t t = 56; t < 64; ++t) EXPECT_TRUE(std::isinf(avg->head(0)[t]));
  EXPECT_GT(avg->head(0)[12], 10 * avg->head(0)[13]);  // the hot key reaches 2 neighbours each side (kernel 5),
  EXPECT_GT(avg->head(0)[8], 10 * avg->head(0)[7]);    // not 3 as max pooling with kernel 7 does
}

TEST(AttentionScoringTest, H2oKeepsTenPercentRecent) {
  Toy toy(50, 2, 50, 4.0f);
  for (uint32_t j = 0; j < 50; ++j) toy.qpos[j] = j;
  auto s = MakeH2oScorer(0.1)->Score(toy.View(), {});
  ASSERT_TRUE(s.ok());
  for (uint32_t t = 45; t < 50; ++t) EXPECT_TRUE(std::isinf(s->head(0)[t]));
  EXPECT_TRUE(std::isfinite(s->head(0)[44]));
  EXPECT_GT(s->head(0)[2], s->head(0)[30]);
}

TEST(AttentionScoringTest, AgentKvTakesTheMaxOverPhases) {
  Toy toy(40, 5, 4, 6.0f);
  // A "tool" phase whose queries look along e0 (away from the hot key):
  // recent queries alone would undervalue the e0 keys it needs.
  std::vector<float> tool(size_t(toy.heads) * 2 * toy.d, 0.0f);
  for (size_t i = 0; i < tool.size(); i += 2) tool[i] = 6.0f;
  std::vector<uint32_t> tool_pos = {20, 21};
  ScoreContext ctx;
  ctx.phases.push_back({tool, tool_pos});
  auto with = MakeAgentKvScorer(true, 1)->Score(toy.View(), ctx);
  auto without = MakeAgentKvScorer(true, 1)->Score(toy.View(), {});
  ASSERT_TRUE(with.ok() && without.ok());
  EXPECT_GT(with->head(0)[12], without->head(0)[12]);
  EXPECT_FLOAT_EQ(with->head(0)[5], without->head(0)[5]);  // the hot key keeps its recent-phase score
}

TEST(AttentionScoringTest, RehearsalNeedsProbesAndFollowsThem) {
  Toy toy(30, 12, 2, 6.0f);
  EXPECT_FALSE(MakeRehearsalScorer()->Score(toy.View(), {}).ok());
  std::vector<float> probe(size_t(toy.heads) * toy.d, 0.0f);
  probe[1] = probe[3] = 8.0f;
  std::vector<uint32_t> pos = {UINT32_MAX};
  ScoreContext ctx;
  ctx.probes = {probe, pos};
  auto s = MakeRehearsalScorer(1)->Score(toy.View(), ctx);
  ASSERT_TRUE(s.ok());
  for (uint32_t t = 0; t < 30; ++t)
    if (t != 12) {
      EXPECT_GT(s->head(0)[12], s->head(0)[t]);
    }
}

TEST(AttentionScoringTest, RejectsBadShapes) {
  Toy toy(10, 1, 2, 1.0f);
  LayerKv kv = toy.View();
  kv.k = std::span<const float>(toy.k).first(5);
  EXPECT_FALSE(MakeSnapKvScorer()->Score(kv, {}).ok());
  kv = toy.View();
  kv.n_kv_heads = 3;
  EXPECT_FALSE(MakeStreamingScorer()->Score(kv, {}).ok());
}

}  // namespace
}  // namespace flatkv::attention
