// Segmented prompts (engine_blend.cc): chunk KV stored before RoPE and
// re-rotated exactly, cold and warm chunks alike, and CacheBlend at ratio 1
// equal to a full prefill, bit for bit.
#include <gtest/gtest.h>

#include <cstring>

#include "engine/engine.h"
#include "engine/engine_test_util.h"

namespace flatkv::engine {
namespace {

std::vector<int> Tokens(size_t n, int salt) { return testing::PatternTokens(n, 37, salt, /*bos=*/false); }

// An engine with `eo` over a DRAM store of its block size, kept in `store`.
Result<Engine> DramEngine(const model::Model& m, const EngineOptions& eo, std::unique_ptr<Store>* store) {
  *store = testing::StoreFor(m, eo.block_tokens, Medium::kDram);
  return Engine::Create(m, store->get(), eo);
}

BlendPrompt MakePrompt() {
  BlendPrompt p;
  p.prefix = Tokens(40, 1);
  p.prefix[0] = 1;  // BOS
  p.chunks = {Tokens(70, 2), Tokens(33, 3), Tokens(64, 4)};
  p.tail = Tokens(12, 5);
  return p;
}

BlendResult RunBlend(Engine& e, const BlendPrompt& p, BlendMode mode, float ratio, uint32_t score = 4) {
  BlendOptions o;
  o.mode = mode;
  o.recompute_ratio = ratio;
  o.score_tokens = score;
  auto r = e.Blend(1, p, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return std::move(r).value();
}

bool SameLogits(const BlendResult& a, const BlendResult& b) {
  if (a.logits.size() != b.logits.size()) return false;
  for (size_t i = 0; i < a.logits.size(); ++i)
    if (std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * sizeof(float)) != 0) return false;
  return true;
}

TEST(EngineBlendTest, FullModeEqualsGenerateAndRatioOneEqualsFull) {
  REQUIRE_MODEL();
  for (uint32_t bt : {16u, 64u}) {
    EngineOptions eo;
    eo.block_tokens = bt;
    eo.prefill_chunk = 23;
    std::unique_ptr<Store> store;
    auto e = DramEngine(*model, eo, &store);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    const BlendPrompt p = MakePrompt();
    std::vector<int> flat = p.prefix;
    for (const auto& c : p.chunks) flat.insert(flat.end(), c.begin(), c.end());
    flat.insert(flat.end(), p.tail.begin(), p.tail.end());
    GenerateOptions go;
    go.max_new_tokens = 1;
    go.keep_logits = true;
    auto reference = Engine::Create(*model, nullptr, eo).value().Generate(1, flat, go);
    ASSERT_TRUE(reference.ok());

    const BlendResult full = RunBlend(e.value(), p, BlendMode::kFull, 0);
    ASSERT_EQ(full.logits.size(), 4u);
    EXPECT_EQ(0, std::memcmp(full.logits.back().data(), reference->logits[0].data(), full.logits.back().size() * 4));
    // Cold chunks (prefilled alone and stored), then warm ones (restored).
    const BlendResult cold = RunBlend(e.value(), p, BlendMode::kBlend, 1.0f);
    EXPECT_EQ(cold.prefilled_chunk_tokens, 167u);
    EXPECT_EQ(cold.restored_prefix_tokens, 40u / bt * bt);  // the full run stored the prefix
    const BlendResult warm = RunBlend(e.value(), p, BlendMode::kBlend, 1.0f);
    EXPECT_EQ(warm.reused_chunk_tokens, 167u);
    EXPECT_EQ(warm.prefilled_chunk_tokens, 0u);
    EXPECT_TRUE(SameLogits(full, cold)) << "bt=" << bt;
    EXPECT_TRUE(SameLogits(full, warm)) << "bt=" << bt;
    EXPECT_EQ(warm.selected.size(), 167u);
    EXPECT_DOUBLE_EQ(warm.computed_fraction, double((167 + 12) * 5 + (40 - 40 / bt * bt) * 5) / (219.0 * 5));
  }
}

// Layer 0's KV depends on the token and its position only, so chunk KV
// restored before RoPE and re-rotated at a new position must equal what a
// full prefill writes there, bit for bit; naive reuse of a chunk at
// position 0 is exact in every layer.
TEST(EngineBlendTest, ReRotationIsExact) {
  REQUIRE_MODEL();
  std::unique_ptr<Store> store;
  auto e = DramEngine(*model, testing::SixteenTokenBlocks(), &store);
  ASSERT_TRUE(e.ok());
  const BlendPrompt p = MakePrompt();
  RunBlend(e.value(), p, BlendMode::kNaive, 0);  // stores the chunks
  const model::KvCache& cache = e.value().kv_cache();
  const int kv = model->config.kv_dim();
  RunBlend(e.value(), p, BlendMode::kFull, 0);
  std::vector<float> full_k(219 * kv), full_v(219 * kv);
  for (uint32_t pos = 0; pos < 219; ++pos) {
    std::memcpy(&full_k[pos * kv], cache.k(0, pos), kv * 4);
    std::memcpy(&full_v[pos * kv], cache.v(0, pos), kv * 4);
  }
  const BlendResult naive = RunBlend(e.value(), p, BlendMode::kNaive, 0);
  EXPECT_EQ(naive.reused_chunk_tokens, 167u);
  for (uint32_t pos = 40; pos < 207; ++pos) {
    ASSERT_EQ(0, std::memcmp(&full_k[pos * kv], cache.k(0, pos), kv * 4)) << "K at " << pos;
    ASSERT_EQ(0, std::memcmp(&full_v[pos * kv], cache.v(0, pos), kv * 4)) << "V at " << pos;
  }
  BlendPrompt alone;
  alone.chunks = {p.chunks[0]};
  alone.tail = p.tail;
  EXPECT_TRUE(SameLogits(RunBlend(e.value(), alone, BlendMode::kFull, 0), RunBlend(e.value(), alone, BlendMode::kNaive, 0)));
}

TEST(EngineBlendTest, SelectiveRecomputeComputesWhatItSays) {
  REQUIRE_MODEL();
  std::unique_ptr<Store> store;
  auto e = DramEngine(*model, testing::SixteenTokenBlocks(), &store);
  ASSERT_TRUE(e.ok());
  const BlendPrompt p = MakePrompt();
  RunBlend(e.value(), p, BlendMode::kNaive, 0);
  const BlendResult naive = RunBlend(e.value(), p, BlendMode::kNaive, 0);
  const BlendResult blend = RunBlend(e.value(), p, BlendMode::kBlend, 0.15f);
  // 167 chunk tokens: layer 0 all, layer 1 K and V of all and the layer for
  // ceil(1.5 x 15%) = 38, layer 2 those 38, filtered to ceil(15%) = 26 for
  // layers 3-4; the tail's 12 in all; the prefix's last 8 (32 restored).
  EXPECT_EQ(blend.selected.size(), 26u);
  EXPECT_EQ(blend.computed_token_layers, uint64_t{8 * 5} + 12 * 5 + 167 + 38 * 2 + 26 * 2);
  EXPECT_EQ(blend.kv_only_token_layers, 167u);
  EXPECT_EQ(naive.computed_token_layers, uint64_t{8 * 5} + 12 * 5);
  EXPECT_FALSE(SameLogits(naive, blend));
  BlendOptions bad;
  bad.score_tokens = 13;
  EXPECT_FALSE(e.value().Blend(1, p, bad).ok());
  bad.score_tokens = 1;
  bad.recompute_ratio = 1.5f;
  EXPECT_FALSE(e.value().Blend(1, p, bad).ok());
}

}  // namespace
}  // namespace flatkv::engine
