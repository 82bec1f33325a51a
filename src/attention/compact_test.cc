// Compaction through the reference engine: nothing removed decodes
// bit-identically to dense; a compacted session survives the store; bad
// blocks are rejected.
#include "attention/compact.h"

#include <gtest/gtest.h>

#include <cstring>

#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "testing/test_util.h"

namespace flatkv::attention {
namespace {

std::vector<int> Tokens(size_t n, int salt) { return engine::testing::PatternTokens(n, 37, salt); }

engine::GenerateOptions Greedy(uint32_t n) {
  engine::GenerateOptions go;
  go.max_new_tokens = n;
  go.stop_at_eos = false;
  go.keep_logits = true;
  return go;
}

void ExpectSameLogits(const engine::GenerateResult& a, const engine::GenerateResult& b) {
  ASSERT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.logits.size(), b.logits.size());
  for (size_t i = 0; i < a.logits.size(); ++i)
    ASSERT_EQ(0, std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * 4)) << "step " << i;
}

TEST(AttentionCompactTest, NothingRemovedDecodesBitIdenticallyToDense) {
  REQUIRE_MODEL();
  const auto prompt = Tokens(100, 1), next = Tokens(7, 2);
  std::vector<int> whole = prompt;
  whole.insert(whole.end(), next.begin(), next.end());
  engine::EngineOptions eo;
  eo.prefill_chunk = 13;
  auto dense = engine::Engine::Create(*model, nullptr, eo);
  ASSERT_TRUE(dense.ok());
  auto want = dense->Generate(1, whole, Greedy(6));
  ASSERT_TRUE(want.ok());
  for (const char* alloc : {"uniform", "adakv", "champion", "pyramid"}) {
    auto e = engine::Engine::Create(*model, nullptr, eo);
    auto scorer = MakeSnapKvScorer();
    CompactOptions co;
    co.scorer = scorer.get();
    co.allocator = ParseAllocator(alloc).value();
    co.budget.ratio = 0.0;
    auto ckv = e->Compact(prompt, co);
    ASSERT_TRUE(ckv.ok()) << ckv.status().ToString();
    EXPECT_EQ(ckv->kept_entries(), uint64_t{100} * model->config.n_layers * model->config.n_kv_heads);
    auto got = e->GenerateCompacted(*ckv, next, Greedy(6));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ExpectSameLogits(*want, *got);
  }
}

TEST(AttentionCompactTest, HalfRemovedStaysCloseAndKeepsItsBudget) {
  REQUIRE_MODEL();
  const auto prompt = Tokens(128, 3), next = Tokens(3, 4);
  auto e = engine::Engine::Create(*model, nullptr, {});
  auto scorer = MakeSnapKvScorer();
  CompactOptions co;
  co.scorer = scorer.get();
  co.budget.ratio = 0.5;
  auto ckv = e->Compact(prompt, co);
  ASSERT_TRUE(ckv.ok());
  EXPECT_EQ(ckv->kept_entries(), uint64_t{64} * model->config.n_layers * model->config.n_kv_heads);
  for (const auto& h : ckv->heads)
    for (uint32_t p = 96; p < 128; ++p) EXPECT_TRUE(std::binary_search(h.pos.begin(), h.pos.end(), p));  // window
  auto got = e->GenerateCompacted(*ckv, next, Greedy(4));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->tokens.size(), 4u);
}

// A SnapKV window wider than CompactOptions::window gets all its queries:
// kvpress's 64-query window keeps its 64 newest keys, not the default 32.
TEST(AttentionCompactTest, TheScorersOwnWindowWinsOverTheDefault) {
  REQUIRE_MODEL();
  const auto prompt = Tokens(200, 5);
  auto e = engine::Engine::Create(*model, nullptr, {});
  auto scorer = MakeSnapKvScorer(64, 5, Pool::kAvg);
  CompactOptions co;
  co.scorer = scorer.get();
  co.budget.ratio = 0.5;
  ASSERT_EQ(co.window, 32u);
  auto ckv = e->Compact(prompt, co);
  ASSERT_TRUE(ckv.ok()) << ckv.status().ToString();
  for (const auto& h : ckv->heads)
    for (uint32_t p = 136; p < 200; ++p) EXPECT_TRUE(std::binary_search(h.pos.begin(), h.pos.end(), p)) << p;
}

TEST(AttentionCompactTest, StoreRoundTripCarriesACompressedConversation) {
  REQUIRE_MODEL();
  ::flatkv::testing::TempDir dir;
  StoreOptions so = ::flatkv::testing::SmallOptions(dir.path(), 0, 16);  // the stories260K shape, SSD only
  so.placement = std::make_shared<FixedPlacement>(Medium::kSsd);
  auto store = Store::Open(so);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const auto prompt = Tokens(150, 5), next = Tokens(5, 6);
  auto e = engine::Engine::Create(*model, store->get(), {});
  ASSERT_TRUE(e.ok());
  auto scorer = MakeH2oScorer();
  CompactOptions co;
  co.scorer = scorer.get();
  co.allocator = Allocator::kAdaKv;  // uneven per-head counts: exercises the padding
  co.budget.ratio = 0.6;
  auto ckv = e->Compact(prompt, co);
  ASSERT_TRUE(ckv.ok());
  EXPECT_FALSE(e->RestoreCompacted(prompt, "h2o-adakv-0.6").ok());  // nothing stored yet
  ASSERT_TRUE(e->PutCompacted(7, prompt, *ckv, "h2o-adakv-0.6").ok());
  auto back = e->RestoreCompacted(prompt, "h2o-adakv-0.6");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(*back == *ckv);
  EXPECT_FALSE(e->RestoreCompacted(prompt, "other-tag").ok());
  auto before = e->GenerateCompacted(*ckv, next, Greedy(5));
  auto e2 = engine::Engine::Create(*model, store->get(), {});  // a later turn, a fresh engine
  auto after = e2->GenerateCompacted(*back, next, Greedy(5));
  ASSERT_TRUE(before.ok() && after.ok());
  ExpectSameLogits(*before, *after);
  ASSERT_TRUE((*store)->Close().ok());
}

TEST(AttentionCompactTest, EngineRejectsBadCompactedRequests) {
  REQUIRE_MODEL();
  auto e = engine::Engine::Create(*model, nullptr, {});
  auto scorer = MakeStreamingScorer();
  CompactOptions co;
  co.scorer = scorer.get();
  const auto prompt = Tokens(40, 7);
  auto ckv = e->Compact(prompt, co);
  ASSERT_TRUE(ckv.ok());
  EXPECT_FALSE(e->GenerateCompacted(*ckv, {}, Greedy(2)).ok());                        // nothing to continue with
  const std::vector<int> bad = {1, 100000};
  EXPECT_FALSE(e->GenerateCompacted(*ckv, bad, Greedy(2)).ok());                       // token out of range
  EXPECT_FALSE(e->GenerateCompacted(*ckv, Tokens(3, 1), Greedy(1000)).ok());           // past max_context
  CompactedKv wrong = *ckv;
  wrong.n_kv_heads = 1;
  EXPECT_FALSE(e->GenerateCompacted(wrong, Tokens(3, 1), Greedy(2)).ok());             // another model's shape
  EXPECT_EQ(e->PutCompacted(1, prompt, *ckv, "t").code(), Code::kFailedPrecondition);  // no store
  EXPECT_FALSE(e->RestoreCompacted(prompt, "t").ok());
  co.scorer = nullptr;
  EXPECT_FALSE(e->Compact(prompt, co).ok());
  EXPECT_FALSE(e->Compact({}, co).ok());
}

TEST(AttentionCompactTest, DecodeRejectsDamagedBlocks) {
  model::Config c;
  c.dim = 16;
  c.n_heads = 2;
  c.n_kv_heads = 2;
  c.n_layers = 2;
  CompactedKv ckv;
  ckv.n_layers = 2;
  ckv.n_kv_heads = 2;
  ckv.head_dim = 8;
  ckv.prefix_len = 40;
  ckv.heads.resize(4);
  for (int i = 0; i < 4; ++i)
    for (uint32_t p = 0; p < 40; p += 1 + i) {
      ckv.heads[i].pos.push_back(p);
      for (int d = 0; d < 8; ++d) {
        ckv.heads[i].k.push_back(float(p) + d);
        ckv.heads[i].v.push_back(-float(p) - d);
      }
    }
  const uint32_t bt = 16, blocks = CompactedBlocks(ckv, bt);
  auto data = EncodeCompacted(ckv, bt);
  auto ok = DecodeCompacted(data, blocks, c, bt);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_TRUE(*ok == ckv);
  EXPECT_FALSE(DecodeCompacted(data, blocks - 1, c, bt).ok());
  auto bad = data;
  bad[0] = std::byte{'X'};
  EXPECT_EQ(DecodeCompacted(bad, blocks, c, bt).status().code(), Code::kCorruption);
  bad = data;
  bad[48] = std::byte{0xFF};  // head 0's count
  EXPECT_FALSE(DecodeCompacted(bad, blocks, c, bt).ok());
  bad = data;
  std::memset(bad.data() + 48, 0xFF, 4);
  EXPECT_FALSE(DecodeCompacted(bad, blocks, c, bt).ok());
}

}  // namespace
}  // namespace flatkv::attention
