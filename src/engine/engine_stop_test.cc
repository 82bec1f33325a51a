// Generation stops where the model's tokenizer says a sequence ends: for a
// llama2.c model at BOS, as run.c does (BOS delimits its training stories),
// or EOS; the stop only truncates the run that goes on without it.
#include <gtest/gtest.h>

#include <algorithm>

#include "engine/engine.h"
#include "engine/engine_test_util.h"

namespace flatkv::engine {
namespace {

GenerateResult Greedy(const model::Model& m, const std::vector<int>& prompt, uint32_t steps, bool stop) {
  auto e = Engine::Create(m, nullptr, EngineOptions{});
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  GenerateOptions go;
  go.max_new_tokens = steps;
  go.stop_at_eos = stop;
  auto r = e.value().Generate(1, prompt, go);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return std::move(r).value();
}

TEST(EngineStop, StoriesStopsAtBosAsRunC) {
  REQUIRE_MODEL();
  const model::Tokenizer& tok = *model->tokenizer;
  EXPECT_TRUE(tok.add_bos());
  EXPECT_TRUE(tok.IsEndOfGeneration(tok.bos_id()));
  EXPECT_TRUE(tok.IsEndOfGeneration(tok.eos_id()));
  auto prompt = tok.Encode("Once upon a time", tok.add_bos());
  ASSERT_TRUE(prompt.ok()) << prompt.status().ToString();
  // Without the stop the story ends, BOS follows and a new story begins.
  const GenerateResult on = Greedy(*model, prompt.value(), 400, /*stop=*/false);
  const auto end = std::find_if(on.tokens.begin(), on.tokens.end(), [&](int t) { return tok.IsEndOfGeneration(t); });
  ASSERT_NE(end, on.tokens.end()) << "400 greedy tokens hold no BOS or EOS: the stop is untested";
  EXPECT_EQ(*end, tok.bos_id()) << "run.c's stop is BOS";
  // With it, the run is that run up to and including the BOS.
  const GenerateResult stopped = Greedy(*model, prompt.value(), 400, /*stop=*/true);
  EXPECT_EQ(stopped.tokens, std::vector<int>(on.tokens.begin(), end + 1));
}

}  // namespace
}  // namespace flatkv::engine
