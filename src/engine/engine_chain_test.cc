// Chain Cache and pruned views in the reference engine (engine_chain.cc) on
// the bundled stories260K: an incremental compaction that removes nothing
// is the dense KV bit for bit, one that removes keeps its budget and scores
// fewer candidates than recompressing; the recompress baseline resumed from
// cached KV equals one from scratch; a restored pruned view is the dense KV
// at the kept positions, continues like it, and is used only by requests
// naming its prune set.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "attention/compact.h"
#include "attention/scoring.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "testing/test_util.h"

namespace flatkv::engine {
namespace {

using testing::PatternTokens;

std::vector<int> Cat(std::vector<int> a, const std::vector<int>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

GenerateOptions Greedy(uint32_t n) {
  GenerateOptions go;
  go.max_new_tokens = n;
  go.stop_at_eos = false;
  go.keep_logits = true;
  return go;
}

void ExpectSameLogits(const GenerateResult& a, const GenerateResult& b) {
  ASSERT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.logits.size(), b.logits.size());
  for (size_t i = 0; i < a.logits.size(); ++i)
    ASSERT_EQ(0, std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * 4)) << "step " << i;
}

TEST(EngineChainTest, ExtendingWithoutEvictionIsTheDenseKv) {
  REQUIRE_MODEL();
  const auto history = PatternTokens(90, 37, 1), turn = PatternTokens(41, 37, 2, false);
  auto e = Engine::Create(*model, nullptr, {});
  ASSERT_TRUE(e.ok());
  auto prev = e->Uncompacted(history);
  ASSERT_TRUE(prev.ok());
  auto scorer = attention::MakeSnapKvScorer(16);
  attention::CompactOptions co;
  co.scorer = scorer.get();
  co.window = 16;
  CompactionWork work;
  auto got = e->ExtendCompacted(*prev, turn, co, 1000, &work);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  auto dense = Engine::Create(*model, nullptr, {});
  auto want = dense->Uncompacted(Cat(history, turn));
  ASSERT_TRUE(want.ok());
  EXPECT_TRUE(*got == *want);
  EXPECT_EQ(work.candidates, 131u);
  // Window queries against the candidates, per layer and query head, causal.
  const uint64_t per = 16ull * 131 - 16 * 15 / 2;
  EXPECT_EQ(work.score_evals, per * model->config.n_layers * model->config.n_heads);
}

TEST(EngineChainTest, ExtendingKeepsItsBudgetAndScoresFewerCandidatesThanRecompressing) {
  REQUIRE_MODEL();
  auto scorer = attention::MakeSnapKvScorer(16);
  attention::CompactOptions co;
  co.scorer = scorer.get();
  co.window = 16;
  auto chain = Engine::Create(*model, nullptr, {});
  auto re = Engine::Create(*model, nullptr, {});
  auto scratch = Engine::Create(*model, nullptr, {});
  std::vector<int> prompt = PatternTokens(60, 37, 3);
  auto state = chain->CompactKeeping(prompt, co, 24);
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  auto re_state = re->CompactKeeping(prompt, co, 24);
  ASSERT_TRUE(re_state.ok());
  EXPECT_TRUE(*state == *re_state);
  for (int t = 0; t < 4; ++t) {
    const auto turn = PatternTokens(50, 41 + t, 4 + t, false);
    const auto cached = static_cast<uint32_t>(prompt.size());
    prompt = Cat(prompt, turn);
    CompactionWork wc, wr;
    auto next = chain->ExtendCompacted(*state, turn, co, 24, &wc);
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    EXPECT_EQ(next->prefix_len, prompt.size());
    for (const auto& h : next->heads) {
      EXPECT_EQ(h.pos.size(), 24u);
      EXPECT_TRUE(std::is_sorted(h.pos.begin(), h.pos.end()));
    }
    state = std::move(next);
    // The baseline resumed from the dense KV it holds equals one from scratch.
    auto r = re->CompactKeeping(prompt, co, 24, &wr, cached);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    auto s = scratch->CompactKeeping(prompt, co, 24);
    ASSERT_TRUE(s.ok());
    EXPECT_TRUE(*r == *s) << "turn " << t;
    EXPECT_EQ(wc.candidates, 24u + 50);
    EXPECT_EQ(wr.candidates, prompt.size());
    EXPECT_LT(wc.score_evals, wr.score_evals);
    // The chained state decodes: a token and finite logits.
    auto g = chain->GenerateCompacted(*state, PatternTokens(3, 43, 9, false), Greedy(2));
    ASSERT_TRUE(g.ok()) << g.status().ToString();
  }
  // Unequal counts per head (an Ada-KV allocation) cannot be extended.
  attention::CompactedKv bad = *state;
  bad.at(0, 0).pos.pop_back();
  bad.at(0, 0).k.resize(bad.at(0, 0).pos.size() * bad.head_dim);
  bad.at(0, 0).v.resize(bad.at(0, 0).pos.size() * bad.head_dim);
  auto refused = chain->ExtendCompacted(bad, PatternTokens(20, 5, 1, false), co, 24);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("equal counts per head"), std::string::npos) << refused.status().ToString();
}

TEST(EngineChainTest, APrunedViewRestoresTheKeptKvAndOnlyItsRequestsUseIt) {
  REQUIRE_MODEL();
  ::flatkv::testing::TempDir dir;
  auto store = testing::StoreFor(*model, 16, Medium::kSsd, dir.Sub("ssd"));
  ASSERT_NE(store, nullptr);
  auto e = Engine::Create(*model, store.get(), testing::SixteenTokenBlocks());
  ASSERT_TRUE(e.ok());
  const auto history = PatternTokens(100, 37, 5), turn = PatternTokens(20, 39, 6, false);
  ASSERT_TRUE(e->Generate(1, history, Greedy(1)).ok());  // stores the history's 6 full blocks
  const PruneSpec spec{6, {{3, 9}, {40, 80}}};
  auto pr = e->PruneHistory(history, spec);
  ASSERT_TRUE(pr.ok()) << pr.status().ToString();
  EXPECT_EQ(pr->kept_tokens, 96u - 6 - 40);
  EXPECT_EQ(pr->view_blocks, 4u);
  // The view is the dense KV at the kept positions, with those positions.
  auto ckv = e->RestorePruned(Cat(history, turn), spec);
  ASSERT_TRUE(ckv.ok()) << ckv.status().ToString();
  auto dense = Engine::Create(*model, nullptr, testing::SixteenTokenBlocks());
  ASSERT_TRUE(dense->Uncompacted(history).ok());
  const auto kept = PruneKeptPositions(spec.ranges, 96);
  const attention::Selection sel(model->config.n_layers,
                                 std::vector<std::vector<uint32_t>>(model->config.n_kv_heads, kept));
  auto want = attention::Compact(dense->kv_cache(), model->config, 96, sel);
  ASSERT_TRUE(want.ok());
  EXPECT_TRUE(*ckv == *want);
  // A request naming the prune set continues from the view, like the
  // compacted KV it is.
  const std::vector<int> rest(history.begin() + 96, history.end());
  auto got = e->GeneratePruned(2, Cat(history, turn), spec, Greedy(4));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->restored_pruned_tokens, kept.size());
  auto ref = dense->GenerateCompacted(*want, Cat(rest, turn), Greedy(4));
  ASSERT_TRUE(ref.ok());
  ExpectSameLogits(*ref, *got);
  // Requests naming no prune set, or another one, never get pruned KV: they
  // are the dense request, bit for bit.
  auto cold = Engine::Create(*model, nullptr, testing::SixteenTokenBlocks());
  auto exact = cold->Generate(3, Cat(history, turn), Greedy(4));
  ASSERT_TRUE(exact.ok());
  for (const PruneSpec& other : {PruneSpec{}, PruneSpec{6, {{3, 9}}}, PruneSpec{5, {{3, 9}, {40, 80}}}}) {
    auto r = e->GeneratePruned(4, Cat(history, turn), other, Greedy(4));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->restored_pruned_tokens, 0u);
    ExpectSameLogits(*exact, *r);
  }
  // The unpruned blocks may go: the view stays reachable by the logical prefix.
  ASSERT_TRUE(store->DropSession(1).ok());
  EXPECT_TRUE(e->RestorePruned(Cat(history, turn), spec).ok());
  // Bad requests.
  EXPECT_EQ(e->RestorePruned(history, PruneSpec{7, {{0, 1}}}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(e->RestorePruned(history, PruneSpec{6, {{90, 200}}}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(e->GeneratePruned(5, std::vector<int>(history.begin(), history.begin() + 96), spec, Greedy(1)).status().code(),
            Code::kInvalidArgument);
}

TEST(EngineChainTest, ScoringAContinuationCountsItsTokens) {
  REQUIRE_MODEL();
  auto e = Engine::Create(*model, nullptr, {});
  const auto history = PatternTokens(40, 37, 7), next = PatternTokens(30, 37, 8, false);
  auto ckv = e->Uncompacted(history);
  ASSERT_TRUE(ckv.ok());
  auto all = e->ScoreCompacted(*ckv, next);
  auto tail = e->ScoreCompacted(*ckv, next, 10);
  ASSERT_TRUE(all.ok() && tail.ok());
  EXPECT_EQ(all->count, 29u);
  EXPECT_EQ(tail->count, 20u);
  EXPECT_LT(tail->nll_sum, all->nll_sum);
  EXPECT_GT(all->Perplexity(), 1.0);
  EXPECT_FALSE(e->ScoreCompacted(*ckv, next, 30).ok());
  EXPECT_FALSE(e->ScoreCompacted(*ckv, std::vector<int>{5}).ok());
}

}  // namespace
}  // namespace flatkv::engine
