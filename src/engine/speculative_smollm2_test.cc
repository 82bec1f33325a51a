// Self-speculative decoding on the real SmolLM2-135M (issue 29): with a
// drafter reading 25% of a real-text prompt's KV and RIFT refresh, the
// output equals target-only greedy decoding token for token. Label smollm2
// (CMakeLists.txt: *_smollm2_test.cc); without the model it skips naming
// `scripts/install-deps.sh models`, with CI=true it fails.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/speculative.h"
#include "testing/smollm2_util.h"
#include "testing/test_util.h"

namespace flatkv::engine {
namespace {

TEST(SpeculativeSmolLm2Test, OutputIsTargetGreedyTokenForToken) {
  const auto& loaded = ::flatkv::testing::SmolLm2();
  if (!loaded.model) {
    if (loaded.missing && !::flatkv::testing::InCi()) GTEST_SKIP() << loaded.error;
    FAIL() << loaded.error;
  }
  const model::Model& m = *loaded.model;
  std::string text;
  const std::string path = std::string(FLATKV_SOURCE_DIR) + "/docs/architecture.md";
  ASSERT_TRUE(::flatkv::testing::ReadFile(path, &text)) << path;
  auto tokens = m.tokenizer->Encode(text, false);
  ASSERT_TRUE(tokens.ok());
  ASSERT_GE(tokens->size(), 256u);
  const std::vector<int> prompt(tokens->begin(), tokens->begin() + 256);
  constexpr uint32_t kNew = 40;

  auto engine = Engine::Create(m, nullptr, EngineOptions{});
  ASSERT_TRUE(engine.ok());
  GenerateOptions go;
  go.max_new_tokens = kNew;
  go.stop_at_eos = false;
  auto reference = engine->Generate(1, prompt, go);
  ASSERT_TRUE(reference.ok()) << reference.status().ToString();

  SelfSpeculativeDecoder dec(m, 512, 0);
  ASSERT_TRUE(dec.Prefill(prompt).ok());
  for (RefreshMode mode : {RefreshMode::kPrefillOnly, RefreshMode::kEveryN}) {
    SpeculativeOptions o;
    o.gamma = 4;
    o.max_new_tokens = kNew;
    o.window = 16;  // budget: 25% of the prompt = 64 entries
    o.refresh = mode;
    o.refresh_every = 16;
    auto r = dec.Speculative(o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->kv_budget, 64u);
    EXPECT_EQ(r->tokens, reference->tokens) << RefreshModeName(mode);
    EXPECT_GE(r->acceptance_length(), 1.0);
  }
}

}  // namespace
}  // namespace flatkv::engine
