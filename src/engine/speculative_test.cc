// Self-speculative decoding on the bundled stories260K: the output is
// target-only greedy decoding token for token (and Engine::Generate's), for
// every refresh mode, gamma and a drafter budget small enough to reject
// drafts; bad options are errors naming the value.
#include "engine/speculative.h"

#include <gtest/gtest.h>

#include "engine/engine.h"
#include "engine/engine_test_util.h"

namespace flatkv::engine {
namespace {

TEST(SpeculativeTest, OutputIsTargetGreedyInEveryMode) {
  REQUIRE_MODEL();
  const std::vector<int> prompt = testing::PatternTokens(160, 11);
  constexpr uint32_t kNew = 80;
  auto engine = Engine::Create(*model, nullptr, EngineOptions{});
  ASSERT_TRUE(engine.ok());
  GenerateOptions go;
  go.max_new_tokens = kNew;
  go.stop_at_eos = false;
  auto reference = engine->Generate(1, prompt, go);
  ASSERT_TRUE(reference.ok()) << reference.status().ToString();

  SelfSpeculativeDecoder dec(*model, 512, 2);
  ASSERT_TRUE(dec.Prefill(prompt).ok());
  auto target = dec.Target(kNew, false);
  ASSERT_TRUE(target.ok());
  EXPECT_EQ(target->tokens, reference->tokens);
  uint64_t rejected_somewhere = 0;
  for (RefreshMode mode : {RefreshMode::kPrefillOnly, RefreshMode::kEveryN, RefreshMode::kAdaptive}) {
    for (uint32_t gamma : {1u, 4u, 7u}) {
      SpeculativeOptions o;
      o.gamma = gamma;
      o.max_new_tokens = kNew;
      o.kv_budget = 24;  // 15% of the prompt
      o.window = 8;
      o.obs_window = 8;
      o.refresh = mode;
      o.refresh_every = 16;
      o.adaptive_min_tokens = 8;
      auto r = dec.Speculative(o);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->tokens, reference->tokens) << RefreshModeName(mode) << " gamma " << gamma;
      EXPECT_GT(r->steps, 0u);
      EXPECT_LE(r->acceptance_length(), gamma + 1.0);
      EXPECT_GT(r->prefill_score_evals, 0u);
      rejected_somewhere += r->steps * (gamma + 1) - r->emitted_in_steps;
      if (mode == RefreshMode::kPrefillOnly) {
        EXPECT_EQ(r->refreshes, 0u);
      }
      if (mode == RefreshMode::kEveryN) {
        EXPECT_GE(r->refreshes, kNew / 16 - 2);
        EXPECT_GT(r->refresh_score_evals, 0u);
      }
    }
  }
  EXPECT_GT(rejected_somewhere, 0u) << "a budget this small should reject some drafts";
}

TEST(SpeculativeTest, RejectsBadOptions) {
  REQUIRE_MODEL();
  SelfSpeculativeDecoder dec(*model, 256, 1);
  SpeculativeOptions o;
  EXPECT_EQ(dec.Speculative(o).status().code(), Code::kFailedPrecondition);
  ASSERT_TRUE(dec.Prefill(testing::PatternTokens(100, 3)).ok());
  o.gamma = 0;
  EXPECT_NE(dec.Speculative(o).status().message().find("gamma"), std::string::npos);
  o = {};
  o.kv_budget = 30;
  o.window = 30;
  EXPECT_NE(dec.Speculative(o).status().message().find("window"), std::string::npos);
  o = {};
  o.max_new_tokens = 200;
  EXPECT_NE(dec.Speculative(o).status().message().find("exceed"), std::string::npos);
  EXPECT_FALSE(ParseRefreshMode("sometimes").ok());
  EXPECT_EQ(*ParseRefreshMode("adaptive"), RefreshMode::kAdaptive);
  EXPECT_FALSE(dec.Prefill(std::vector<int>{1, 99999}).ok());
}

}  // namespace
}  // namespace flatkv::engine
