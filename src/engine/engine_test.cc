// The reference engine reuses KV through the store bit-exactly: tokens and
// logits are identical cold, warm from DRAM and warm from SSD, whatever the
// block size, prefill chunk and cached/new split.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "engine/engine_test_util.h"
#include "testing/test_util.h"

namespace flatkv::engine {
namespace {

using ::flatkv::testing::SharedDataDir;
using ::flatkv::testing::TempDir;
using testing::StoreFor;

std::vector<int> Prompt(size_t n, int salt = 0) { return testing::PatternTokens(n, 37, salt); }

GenerateResult RunRequest(const model::Model& m, Store* store, uint32_t block_tokens, uint32_t chunk,
                          const std::vector<int>& prompt, SessionId session = 1, uint32_t new_tokens = 8,
                   float temperature = 0.0f, uint32_t max_context = 0) {
  EngineOptions eo;
  eo.block_tokens = block_tokens;
  eo.prefill_chunk = chunk;
  eo.max_context = max_context;
  auto e = Engine::Create(m, store, eo);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  GenerateOptions go;
  go.max_new_tokens = new_tokens;
  go.temperature = temperature;
  go.top_p = 0.9f;
  go.seed = 42;
  go.stop_at_eos = false;
  go.keep_logits = true;
  auto r = e.value().Generate(session, prompt, go);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return std::move(r).value();
}

void ExpectBitIdentical(const GenerateResult& a, const GenerateResult& b, const std::string& what) {
  ASSERT_EQ(a.tokens, b.tokens) << what;
  ASSERT_EQ(a.logits.size(), b.logits.size()) << what;
  for (size_t i = 0; i < a.logits.size(); ++i)
    ASSERT_EQ(0, std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * sizeof(float)))
        << what << ": logits of step " << i << " differ";
}

TEST(EngineTest, ColdDramAndSsdAreBitIdenticalAcrossBlockSizesChunksAndSplits) {
  REQUIRE_MODEL();
  for (uint32_t bt : {16u, 64u}) {
    for (size_t len : {1u, 15u, 16u, 17u, 64u, 65u, 130u, 200u}) {
      const auto prompt = Prompt(len, static_cast<int>(bt));
      const GenerateResult cold = RunRequest(*model, nullptr, bt, 64, prompt);
      for (Medium medium : {Medium::kDram, Medium::kSsd}) {
        TempDir dir;
        auto store = StoreFor(*model, bt, medium, dir.Sub("ssd"));
        // First request computes and stores; the second restores.
        const GenerateResult first = RunRequest(*model, store.get(), bt, 7, prompt);
        ExpectBitIdentical(cold, first, "first");
        for (uint32_t chunk : {1u, 5u, 64u}) {
          const GenerateResult warm = RunRequest(*model, store.get(), bt, chunk, prompt);
          const std::string what = "bt=" + std::to_string(bt) + " len=" + std::to_string(len) + " chunk=" +
                                   std::to_string(chunk) + " " + std::string(MediumName(medium));
          ExpectBitIdentical(cold, warm, what);
          const uint32_t expect_restored = static_cast<uint32_t>((len - 1) / bt * bt);
          EXPECT_EQ(medium == Medium::kDram ? warm.restored_tokens_dram : warm.restored_tokens_ssd, expect_restored) << what;
          EXPECT_EQ(warm.computed_prompt_tokens, len - expect_restored) << what;
        }
      }
    }
  }
}

TEST(EngineTest, SampledDecodingIsBitIdenticalWarmAndCold) {
  REQUIRE_MODEL();
  TempDir dir;
  auto store = StoreFor(*model, 32, Medium::kSsd, dir.Sub("ssd"));
  const auto prompt = Prompt(100, 3);
  const GenerateResult cold = RunRequest(*model, nullptr, 32, 64, prompt, 1, 24, 0.8f);
  RunRequest(*model, store.get(), 32, 64, prompt, 1, 24, 0.8f);
  const GenerateResult warm = RunRequest(*model, store.get(), 32, 9, prompt, 1, 24, 0.8f);
  EXPECT_EQ(warm.restored_tokens_ssd, 96u);
  ExpectBitIdentical(cold, warm, "sampled");
}

// A namespace's codec: blocks are stored encoded (growing turn by turn, so
// puts start mid-chain) and a lossless codec restores them bit-exactly.
TEST(EngineTest, ALosslessCodecIsBitIdenticalColdAndWarm) {
  REQUIRE_MODEL();
  for (Medium medium : {Medium::kDram, Medium::kSsd}) {
    TempDir dir;
    auto store = StoreFor(*model, 16, medium, dir.Sub("ssd"));
    EngineOptions eo;
    eo.block_tokens = 16;
    eo.codec = "raw";
    auto e = Engine::Create(*model, store.get(), eo);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    GenerateOptions go;
    go.max_new_tokens = 4;
    go.stop_at_eos = false;
    go.keep_logits = true;
    for (size_t len : {40u, 90u, 150u}) {  // each turn extends the last one's context
      const auto prompt = Prompt(len, 9);
      const GenerateResult cold = RunRequest(*model, nullptr, 16, 64, prompt, 1, 4);
      auto first = e.value().Generate(1, prompt, go);
      ASSERT_TRUE(first.ok());
      auto warm = e.value().Generate(1, prompt, go);
      ASSERT_TRUE(warm.ok());
      const std::string what = std::string(MediumName(medium)) + " len=" + std::to_string(len);
      ExpectBitIdentical(cold, first.value(), what + " first");
      ExpectBitIdentical(cold, warm.value(), what + " warm");
      EXPECT_EQ(warm->restored_tokens_dram + warm->restored_tokens_ssd, (len - 1) / 16 * 16) << what;
    }
    const StoreStats st = store->Stats();
    const MediumStats& m = medium == Medium::kDram ? st.dram : st.ssd;
    EXPECT_EQ(m.blocks, 149u / 16);
    EXPECT_GT(m.stored_bytes, m.logical_bytes);  // raw's header on every slice: the codec path was taken
  }
  EngineOptions bad;
  bad.block_tokens = 16;
  bad.codec = "nosuchcodec";
  auto e = Engine::Create(*model, nullptr, bad);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("nosuchcodec"), std::string::npos);
}

TEST(EngineTest, ReuseStopsWhereThePromptDiverges) {
  REQUIRE_MODEL();
  TempDir dir;
  auto store = StoreFor(*model, 16, Medium::kDram, dir.Sub("ssd"));
  auto a = Prompt(120, 1);
  RunRequest(*model, store.get(), 16, 64, a);
  auto b = a;
  b[70] = (b[70] + 1) % 512;  // diverges inside block 4 (positions 64..79)
  const GenerateResult cold = RunRequest(*model, nullptr, 16, 64, b);
  const GenerateResult warm = RunRequest(*model, store.get(), 16, 64, b);
  EXPECT_EQ(warm.restored_tokens_dram, 64u);
  ExpectBitIdentical(cold, warm, "diverged");
}

TEST(EngineTest, MultiTurnReusesTheWholeHistoryAndForksShareThePrefix) {
  REQUIRE_MODEL();
  TempDir dir;
  auto store = StoreFor(*model, 16, Medium::kSsd, dir.Sub("ssd"));
  auto turn1 = Prompt(50, 2);
  const GenerateResult r1 = RunRequest(*model, store.get(), 16, 64, turn1, 7, 30);
  // Turn 2: the history (prompt + response) plus a new message.
  auto turn2 = turn1;
  turn2.insert(turn2.end(), r1.tokens.begin(), r1.tokens.end());
  const size_t history = turn2.size();
  auto more = Prompt(20, 9);
  turn2.insert(turn2.end(), more.begin() + 1, more.end());
  const GenerateResult r2 = RunRequest(*model, store.get(), 16, 64, turn2, 7, 8);
  // Everything whose KV was computed in turn 1 (all but the last sampled token) is reused in whole blocks.
  EXPECT_EQ(r2.restored_tokens_ssd, (history - 1) / 16 * 16);
  ExpectBitIdentical(RunRequest(*model, nullptr, 16, 64, turn2, 7, 8), r2, "turn 2");

  // Two forks of turn 2's prefix: the second stores only its own new blocks.
  auto fork_a = turn2, fork_b = turn2;
  auto ta = Prompt(40, 11), tb = Prompt(40, 12);
  fork_a.insert(fork_a.end(), ta.begin() + 1, ta.end());
  fork_b.insert(fork_b.end(), tb.begin() + 1, tb.end());
  const uint64_t before = store->Stats().put_blocks;
  const GenerateResult fa = RunRequest(*model, store.get(), 16, 64, fork_a, 8, 1);
  const GenerateResult fb = RunRequest(*model, store.get(), 16, 64, fork_b, 9, 1);
  EXPECT_EQ(fa.restored_tokens_ssd, fb.restored_tokens_ssd);
  EXPECT_EQ(store->Stats().put_blocks - before, uint64_t{fa.stored_blocks} + fb.stored_blocks);
  EXPECT_LE(fb.stored_blocks, fork_b.size() / 16 - fb.restored_tokens_ssd / 16);
}

TEST(EngineTest, OtherWeightsAdaptersAndTenantsNeverHit) {
  REQUIRE_MODEL();
  TempDir dir;
  auto store = StoreFor(*model, 16, Medium::kDram, dir.Sub("ssd"));
  const auto prompt = Prompt(90, 4);
  RunRequest(*model, store.get(), 16, 64, prompt);
  EXPECT_EQ(RunRequest(*model, store.get(), 16, 64, prompt).restored_tokens_dram, 80u);

  model::Model changed = *model;
  changed.weights.layers[2].wv[5] += 1e-3f;
  changed.fingerprint = model::Fingerprint(changed.config, changed.weights);
  ASSERT_NE(changed.fingerprint, model->fingerprint);
  EXPECT_EQ(RunRequest(changed, store.get(), 16, 64, prompt).restored_tokens_dram, 0u);

  for (int which = 0; which < 2; ++which) {
    EngineOptions eo;
    eo.block_tokens = 16;
    (which == 0 ? eo.adapter_id : eo.tenant_salt) = "other";
    auto e = Engine::Create(*model, store.get(), eo);
    ASSERT_TRUE(e.ok());
    auto r = e.value().Generate(1, prompt, {});
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->restored_tokens_dram, 0u) << which;
  }
}

TEST(EngineTest, ContextCanExceedTheCheckpointsSeqLen) {
  REQUIRE_MODEL();
  TempDir dir;
  auto store = StoreFor(*model, 64, Medium::kSsd, dir.Sub("ssd"));
  const auto prompt = Prompt(700, 5);  // seq_len is 512
  const GenerateResult cold = RunRequest(*model, nullptr, 64, 128, prompt, 1, 4, 0.0f, 1024);
  RunRequest(*model, store.get(), 64, 128, prompt, 1, 4, 0.0f, 1024);
  const GenerateResult warm = RunRequest(*model, store.get(), 64, 128, prompt, 1, 4, 0.0f, 1024);
  EXPECT_EQ(warm.restored_tokens_ssd, 640u);
  ExpectBitIdentical(cold, warm, "long");
}

TEST(EngineTest, BadRequestsGetClearErrors) {
  REQUIRE_MODEL();
  EngineOptions eo;
  auto e = Engine::Create(*model, nullptr, eo);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e.value().Generate(1, {}, {}).status().code(), Code::kInvalidArgument);
  std::vector<int> bad = {1, 600};
  auto r = e.value().Generate(1, bad, {});
  EXPECT_NE(r.status().message().find("token 1 is 600"), std::string::npos) << r.status().ToString();
  GenerateOptions go;
  go.max_new_tokens = 10;
  EXPECT_NE(e.value().Generate(1, Prompt(510), go).status().message().find("max_context"), std::string::npos);
  TempDir dir;
  auto store = StoreFor(*model, 16, Medium::kDram, dir.Sub("ssd"));
  eo.block_tokens = 64;
  EXPECT_FALSE(Engine::Create(*model, store.get(), eo).ok());  // block size differs from the store's
  eo.prefill_chunk = 0;
  EXPECT_FALSE(Engine::Create(*model, nullptr, eo).ok());
  eo.prefill_chunk = 64;
  eo.threads = -1;
  auto neg = Engine::Create(*model, nullptr, eo);
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.status().message().find("threads=-1"), std::string::npos) << neg.status().ToString();
}

// The transformer's thread count (EngineOptions::threads) never changes a
// token or a logit bit, warm or cold.
TEST(EngineTest, ThreadCountDoesNotChangeResults) {
  REQUIRE_MODEL();
  TempDir dir;
  auto store = StoreFor(*model, 16, Medium::kDram, dir.Sub("ssd"));
  const auto prompt = Prompt(150, 5);
  std::vector<GenerateResult> runs;
  // threads 2 twice with the store: the second request restores the prompt's blocks.
  for (auto [threads, st] : {std::pair{1, (Store*)nullptr}, std::pair{2, store.get()}, std::pair{2, store.get()},
                             std::pair{5, (Store*)nullptr}}) {
    EngineOptions eo;
    eo.block_tokens = 16;
    eo.prefill_chunk = 37;
    eo.threads = threads;
    auto e = Engine::Create(*model, st, eo);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ(e.value().transformer().threads(), threads);
    GenerateOptions go;
    go.max_new_tokens = 12;
    go.temperature = 0.8f;
    go.seed = 7;
    go.stop_at_eos = false;
    go.keep_logits = true;
    auto r = e.value().Generate(1, prompt, go);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    runs.push_back(std::move(r).value());
  }
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_GT(runs[2].restored_tokens_dram, 0u);
  for (size_t i = 1; i < runs.size(); ++i) ExpectBitIdentical(runs[0], runs[i], "run " + std::to_string(i));
}

TEST(EngineTest, PerplexityOfTheModelsOwnGreedyTextIsLow) {
  REQUIRE_MODEL();
  auto e = Engine::Create(*model, nullptr, {});
  ASSERT_TRUE(e.ok());
  auto tokens = model->tokenizer->Encode(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.", true);
  ASSERT_TRUE(tokens.ok());
  auto ppl = e.value().Perplexity(tokens.value());
  ASSERT_TRUE(ppl.ok());
  EXPECT_GT(ppl.value(), 1.0);
  EXPECT_LT(ppl.value(), 10.0);  // its own greedy text: very likely under the model
  auto noise = e.value().Perplexity(Prompt(100, 8));
  ASSERT_TRUE(noise.ok());
  EXPECT_GT(noise.value(), ppl.value() * 5);
}

}  // namespace
}  // namespace flatkv::engine

namespace flatkv::engine {
namespace {

// The same weights loaded from GGUF share the llama2.c checkpoint's KV.
TEST(EngineTest, GgufAndLlama2cOfTheSameWeightsShareKv) {
  REQUIRE_MODEL();
  const std::string gguf_path = SharedDataDir() + "/gguf/stories260K.gguf";
  if (!std::filesystem::exists(gguf_path)) GTEST_SKIP() << "shared data not found: " << gguf_path;
  auto gguf = model::LoadGguf(gguf_path);
  ASSERT_TRUE(gguf.ok()) << gguf.status().ToString();
  EXPECT_EQ(gguf->fingerprint, model->fingerprint);
  TempDir dir;
  auto store = StoreFor(*model, 16, Medium::kSsd, dir.Sub("ssd"));
  const auto prompt = Prompt(80, 6);
  const GenerateResult cold = RunRequest(*model, nullptr, 16, 64, prompt);
  RunRequest(*model, store.get(), 16, 64, prompt);
  const GenerateResult warm = RunRequest(gguf.value(), store.get(), 16, 64, prompt);
  EXPECT_EQ(warm.restored_tokens_ssd, 64u);
  ExpectBitIdentical(cold, warm, "gguf warm");
}

}  // namespace
}  // namespace flatkv::engine
