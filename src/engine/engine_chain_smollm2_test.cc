// Chain Cache and pruned views on the real SmolLM2-135M-Instruct (30 layers,
// GQA 9/3): a short real-text history (the start of docs/attention.md) is
// stored, pruned and restored; the view is the dense KV at the kept
// positions and continues bit-identically to it, and an incremental
// compaction that removes nothing is the dense KV. Label smollm2 (Release
// only); without the model file it skips (CI=true: fails), naming
// `scripts/install-deps.sh models`.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "attention/compact.h"
#include "attention/scoring.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "testing/smollm2_util.h"
#include "testing/test_util.h"

namespace flatkv::engine {
namespace {

constexpr uint32_t kBlockTokens = 32;

std::vector<int> Text(const model::Model& m, size_t n) {
  std::string text;
  const std::string path = std::string(FLATKV_SOURCE_DIR) + "/docs/attention.md";
  if (!::flatkv::testing::ReadFile(path, &text)) {
    ADD_FAILURE() << "cannot read " << path;
    return {};
  }
  auto tokens = m.tokenizer->Encode(text, /*bos=*/false);
  if (!tokens.ok() || tokens->size() < n) {
    ADD_FAILURE() << path << ": too few tokens";
    return {};
  }
  return std::vector<int>(tokens->begin(), tokens->begin() + n);
}

GenerateOptions Greedy(uint32_t n) {
  GenerateOptions go;
  go.max_new_tokens = n;
  go.stop_at_eos = false;
  go.keep_logits = true;
  return go;
}

TEST(EngineChainSmolLm2Test, APrunedHistoryRestoresAndContinuesLikeTheKeptDenseKv) {
  FLATKV_REQUIRE_SMOLLM2(model);
  const std::vector<int> all = Text(*model, 276);
  ASSERT_EQ(all.size(), 276u);
  const std::vector<int> history(all.begin(), all.begin() + 256);
  ::flatkv::testing::TempDir dir;
  auto store = testing::StoreFor(*model, kBlockTokens, Medium::kSsd, dir.Sub("ssd"));
  ASSERT_NE(store, nullptr);
  EngineOptions eo;
  eo.block_tokens = kBlockTokens;
  eo.max_context = 512;  // the KV cache of 8192 positions would be 377 MB per engine
  auto e = Engine::Create(*model, store.get(), eo);
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE(e->Generate(1, history, Greedy(1)).ok());  // stores 8 blocks
  const PruneSpec spec{8, {{32, 96}, {150, 200}}};    // 114 of 256 tokens go
  auto pr = e->PruneHistory(history, spec);
  ASSERT_TRUE(pr.ok()) << pr.status().ToString();
  EXPECT_EQ(pr->kept_tokens, 142u);
  EXPECT_EQ(pr->view_blocks, 5u);
  ASSERT_TRUE(store->DropSession(1).ok());  // the unpruned blocks go
  auto ckv = e->RestorePruned(all, spec);
  ASSERT_TRUE(ckv.ok()) << ckv.status().ToString();
  auto dense = Engine::Create(*model, nullptr, eo);
  ASSERT_TRUE(dense->Uncompacted(history).ok());
  const attention::Selection sel(
      model->config.n_layers,
      std::vector<std::vector<uint32_t>>(model->config.n_kv_heads, PruneKeptPositions(spec.ranges, 256)));
  auto want = attention::Compact(dense->kv_cache(), model->config, 256, sel);
  ASSERT_TRUE(want.ok());
  EXPECT_TRUE(*ckv == *want);
  auto got = e->GeneratePruned(2, all, spec, Greedy(4));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->restored_pruned_tokens, 142u);
  auto ref = dense->GenerateCompacted(*want, std::vector<int>(all.begin() + 256, all.end()), Greedy(4));
  ASSERT_TRUE(ref.ok());
  ASSERT_EQ(got->tokens, ref->tokens);
  for (size_t i = 0; i < ref->logits.size(); ++i)
    ASSERT_EQ(0, std::memcmp(got->logits[i].data(), ref->logits[i].data(), ref->logits[i].size() * 4)) << "step " << i;
}

TEST(EngineChainSmolLm2Test, ExtendingWithoutEvictionIsTheDenseKv) {
  FLATKV_REQUIRE_SMOLLM2(model);
  const std::vector<int> all = Text(*model, 200);
  ASSERT_EQ(all.size(), 200u);
  EngineOptions eo;
  eo.max_context = 256;
  auto e = Engine::Create(*model, nullptr, eo);
  ASSERT_TRUE(e.ok());
  auto prev = e->Uncompacted(std::vector<int>(all.begin(), all.begin() + 150));
  ASSERT_TRUE(prev.ok());
  auto scorer = attention::MakeSnapKvScorer(16);
  attention::CompactOptions co;
  co.scorer = scorer.get();
  co.window = 16;
  auto got = e->ExtendCompacted(*prev, std::vector<int>(all.begin() + 150, all.end()), co, 1000);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  auto dense = Engine::Create(*model, nullptr, eo);
  auto want = dense->Uncompacted(all);
  ASSERT_TRUE(want.ok());
  EXPECT_TRUE(*got == *want);
  // With a budget, every head keeps it.
  auto kept = e->ExtendCompacted(*prev, std::vector<int>(all.begin() + 150, all.end()), co, 64);
  ASSERT_TRUE(kept.ok());
  for (const auto& h : kept->heads) EXPECT_EQ(h.pos.size(), 64u);
}

}  // namespace
}  // namespace flatkv::engine
