// Tests for Sampler: greedy ties, per-seed determinism, top-p nucleus and the
// temperature-scaled distribution.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "model/transformer.h"

namespace flatkv::model {
namespace {

std::vector<float> LogProbs(const std::vector<double>& p) {
  std::vector<float> out;
  for (double x : p) out.push_back(static_cast<float>(std::log(x)));
  return out;
}

// Frequency of each token over `draws` samples.
std::vector<double> Frequencies(Sampler& s, const std::vector<float>& logits, int draws) {
  std::vector<double> f(logits.size(), 0.0);
  for (int i = 0; i < draws; ++i) {
    const int t = s.Sample(logits);
    EXPECT_GE(t, 0);
    EXPECT_LT(t, static_cast<int>(logits.size()));
    f[t] += 1.0 / draws;
  }
  return f;
}

TEST(SamplerTest, GreedyTakesTheLowestIndexOnTies) {
  Sampler s(5, 0.0f, 0.9f, 7);
  EXPECT_EQ(s.Sample(std::vector<float>{1, 3, 3, 2, 3}), 1);
  EXPECT_EQ(s.Sample(std::vector<float>{-1, -1, -1, -1, -1}), 0);
  EXPECT_EQ(s.Sample(std::vector<float>{0, 0, 0, 0, 9}), 4);
  // The seed does not matter at temperature 0.
  Sampler other(5, 0.0f, 0.5f, 12345);
  EXPECT_EQ(other.Sample(std::vector<float>{1, 3, 3, 2, 3}), 1);
}

TEST(SamplerTest, SameSeedSameTokens) {
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[i] = std::sin(i * 0.37f) * 2;
  for (float top_p : {0.9f, 1.0f}) {
    for (uint64_t seed : {0ull, 1ull, 42ull, ~0ull}) {
      Sampler a(100, 0.8f, top_p, seed), b(100, 0.8f, top_p, seed);
      std::vector<int> ta, tb;
      for (int i = 0; i < 200; ++i) {
        ta.push_back(a.Sample(logits));
        tb.push_back(b.Sample(logits));
      }
      EXPECT_EQ(ta, tb) << "seed " << seed;
      // Seed 0 is mixed like any other: the draws vary.
      EXPECT_GT(std::count(ta.begin(), ta.end(), ta[0]), 0);
      EXPECT_LT(std::count(ta.begin(), ta.end(), ta[0]), 200) << "seed " << seed;
    }
    Sampler a(100, 0.8f, top_p, 1), b(100, 0.8f, top_p, 2);
    int differ = 0;
    for (int i = 0; i < 200; ++i) differ += a.Sample(logits) != b.Sample(logits);
    EXPECT_GT(differ, 50);
  }
}

TEST(SamplerTest, TinyTopPIsArgmax) {
  const std::vector<float> logits = {0.1f, 2.0f, 1.9f, -3.0f, 2.0f, 0.0f};
  Sampler s(6, 1.0f, 1e-6f, 3);
  for (int i = 0; i < 500; ++i) ASSERT_EQ(s.Sample(logits), 1);
  // Uniform logits: the cutoff prunes every token (run.c would read out of
  // bounds); the nucleus is then the lowest index.
  Sampler u(6, 1.0f, 1e-6f, 3);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(u.Sample(std::vector<float>(6, 0.5f)), 0);
}

TEST(SamplerTest, TopPKeepsToTheNucleus) {
  // Sorted mass 0.5, 0.8, 0.95, 1.0: top_p 0.7 keeps tokens 2 and 0.
  const std::vector<float> logits = LogProbs({0.3, 0.05, 0.5, 0.15});
  Sampler s(4, 1.0f, 0.7f, 99);
  const std::vector<double> f = Frequencies(s, logits, 20000);
  EXPECT_EQ(f[1], 0.0);
  EXPECT_EQ(f[3], 0.0);
  EXPECT_NEAR(f[2], 0.5 / 0.8, 0.02);
  EXPECT_NEAR(f[0], 0.3 / 0.8, 0.02);
}

TEST(SamplerTest, TemperatureShapesTheDistribution) {
  const std::vector<float> logits = LogProbs({0.6, 0.3, 0.1});
  Sampler t1(3, 1.0f, 1.0f, 5);
  std::vector<double> f = Frequencies(t1, logits, 40000);
  EXPECT_NEAR(f[0], 0.6, 0.015);
  EXPECT_NEAR(f[1], 0.3, 0.015);
  EXPECT_NEAR(f[2], 0.1, 0.015);
  // T = 0.5 squares the probabilities: 0.36, 0.09, 0.01 over 0.46.
  Sampler t05(3, 0.5f, 1.0f, 6);
  f = Frequencies(t05, logits, 40000);
  EXPECT_NEAR(f[0], 0.36 / 0.46, 0.015);
  EXPECT_NEAR(f[1], 0.09 / 0.46, 0.015);
  EXPECT_NEAR(f[2], 0.01 / 0.46, 0.01);
  // A high temperature flattens it.
  Sampler hot(3, 100.0f, 1.0f, 8);
  f = Frequencies(hot, logits, 40000);
  for (double x : f) EXPECT_NEAR(x, 1.0 / 3, 0.02);
}

TEST(SamplerTest, BadLogitsStayInRange) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (float top_p : {0.5f, 1.0f}) {
    Sampler s(4, 1.0f, top_p, 11);
    for (const std::vector<float>& logits :
         {std::vector<float>{nan, nan, nan, nan}, std::vector<float>{1, nan, 2, 0}, std::vector<float>{inf, 1, 2, 3},
          std::vector<float>{-inf, -inf, -inf, -inf}}) {
      const int t = s.Sample(logits);
      EXPECT_GE(t, 0);
      EXPECT_LT(t, 4);
    }
  }
  // Fewer logits than the vocabulary: only those are considered.
  Sampler s(10, 0.0f, 1.0f, 1);
  EXPECT_EQ(s.Sample(std::vector<float>{0, 5, 1}), 1);
  EXPECT_EQ(s.Sample(std::vector<float>{}), 0);
}

}  // namespace
}  // namespace flatkv::model
