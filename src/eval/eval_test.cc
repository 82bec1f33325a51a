// The end-to-end protocol (eval/protocol.h) on the bundled stories260K, and
// the workload list and builder (eval/workload.h) on files of the test's own.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "engine/engine_test_util.h"
#include "eval/protocol.h"
#include "eval/workload.h"
#include "testing/test_util.h"

namespace flatkv::eval {
namespace {

using ::flatkv::testing::TempDir;

void Write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

TEST(WorkloadList, ParsesEveryKind) {
  auto specs = ParseWorkloadList(
      "# comment\n"
      "a\tlong\t2048\targparse.py@100\n"
      "b\tmultidoc\t4096\tx.py y.py z.py\n"
      "c\tretrieval\t512\tshutil.py\tdepth=0.25\n");
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  ASSERT_EQ(specs->size(), 3u);
  EXPECT_EQ((*specs)[0].sources[0], "argparse.py@100");
  EXPECT_EQ((*specs)[1].kind, PromptKind::kMultiDoc);
  EXPECT_EQ((*specs)[1].sources.size(), 3u);
  EXPECT_EQ((*specs)[2].context, 512u);
  EXPECT_DOUBLE_EQ((*specs)[2].depth, 0.25);
}

TEST(WorkloadList, RejectsBadLinesNamingThem) {
  struct Case {
    const char* text;
    const char* says;
  } cases[] = {
      {"a\tshort\t2048\tx.py\n", "kind 'short'"},
      {"a\tlong\t20\tx.py\n", "context '20'"},
      {"a\tlong\t9000\tx.py\n", "context '9000'"},
      {"a\tlong\t2048\n", "tab-separated"},
      {"a\tlong\t2048\tx.py y.py\n", "exactly one source"},
      {"a\tmultidoc\t2048\tx.py\n", "at least two"},
      {"a\tretrieval\t2048\tx.py\n", "depth=F"},
      {"a\tretrieval\t2048\tx.py\tdepth=2\n", "depth '2'"},
      {"a\tlong\t2048\tx.py\na\tlong\t2048\ty.py\n", "id a repeats"},
      {"a\tmultidoc\t2048\tx.py@3 y.py\n", "'@offset'"},
  };
  for (const Case& c : cases) {
    auto r = ParseWorkloadList(c.text);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_NE(r.status().ToString().find(c.says), std::string::npos) << r.status().ToString();
  }
}

// A workload of the test's own files, tokenized by stories260K's tokenizer.
class WorkloadBuild : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string text;
    for (int i = 0; i < 60; ++i) text += "Once upon a time there was a little dog named Max number " + std::to_string(i) + ".\n";
    Write(dir_.path() + "/a.txt", text);
    Write(dir_.path() + "/b.txt", "Lily had a red ball. She loved it very much.\n");
    Write(dir_.path() + "/list.tsv",
          "one\tlong\t128\ta.txt@10\n"
          "two\tmultidoc\t192\tb.txt a.txt\n");
    WriteSums();
    o_.root = dir_.path();
    o_.list_path = dir_.path() + "/list.tsv";
    o_.sha256_path = dir_.path() + "/sums";
    o_.continuation_tokens = 32;
  }
  void WriteSums() {
    std::string a, b;
    ASSERT_TRUE(::flatkv::testing::ReadFile(dir_.path() + "/a.txt", &a));
    ASSERT_TRUE(::flatkv::testing::ReadFile(dir_.path() + "/b.txt", &b));
    Write(dir_.path() + "/sums", "# test\n" + Sha256Hex(a) + "  a.txt\n" + Sha256Hex(b) + "  b.txt\n");
  }
  TempDir dir_;
  WorkloadOptions o_;
};

TEST_F(WorkloadBuild, BuildsLongAndMultiDocPrompts) {
  REQUIRE_MODEL();
  auto prompts = BuildWorkload(*model, o_);
  ASSERT_TRUE(prompts.ok()) << prompts.status().ToString();
  ASSERT_EQ(prompts->size(), 2u);
  const Prompt& one = (*prompts)[0];
  auto all = model->tokenizer->Encode(std::string(60, ' '), false);  // the tokenizer works
  ASSERT_TRUE(all.ok());
  std::string a;
  ASSERT_TRUE(::flatkv::testing::ReadFile(dir_.path() + "/a.txt", &a));
  auto toks = model->tokenizer->Encode(a, false);
  ASSERT_TRUE(toks.ok());
  ASSERT_EQ(one.context.size(), 128u);
  ASSERT_EQ(one.continuation.size(), 32u);
  EXPECT_EQ(one.context, std::vector<int>(toks->begin() + 10, toks->begin() + 138));
  EXPECT_EQ(one.continuation, std::vector<int>(toks->begin() + 138, toks->begin() + 170));
  const Prompt& two = (*prompts)[1];
  EXPECT_EQ(two.kind, PromptKind::kMultiDoc);
  ASSERT_EQ(two.docs.size(), 2u);
  EXPECT_EQ(two.docs[0].size() + two.docs[1].size(), 192u);
  EXPECT_EQ(two.context.size(), 192u);
  // Selection by id and by kind.
  o_.ids = {"two"};
  auto only = BuildWorkload(*model, o_);
  ASSERT_TRUE(only.ok());
  ASSERT_EQ(only->size(), 1u);
  EXPECT_EQ((*only)[0].id, "two");
  o_.ids = {"three"};
  EXPECT_FALSE(BuildWorkload(*model, o_).ok());
  o_.ids = {"two"};  // named but over --max-context: an error that says so, not an empty workload
  o_.max_context = 128;
  auto over = BuildWorkload(*model, o_);
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.status().message().find("'two' has 192 context tokens, over the maximum of 128"), std::string::npos)
      << over.status().ToString();
  o_.max_context = 0;
  o_.ids = {};
  o_.kinds = {"long"};
  auto longs = BuildWorkload(*model, o_);
  ASSERT_TRUE(longs.ok());
  EXPECT_EQ(longs->size(), 1u);
}

TEST_F(WorkloadBuild, AlteredOrMissingSourceIsNamed) {
  REQUIRE_MODEL();
  Write(dir_.path() + "/b.txt", "Lily had a blue ball.\n");
  auto r = BuildWorkload(*model, o_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().ToString().find("b.txt has SHA-256"), std::string::npos) << r.status().ToString();
  std::remove((dir_.path() + "/b.txt").c_str());
  r = BuildWorkload(*model, o_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().ToString().find("b.txt cannot be read"), std::string::npos) << r.status().ToString();
}

TEST_F(WorkloadBuild, TooShortSourceIsNamed) {
  REQUIRE_MODEL();
  Write(dir_.path() + "/list.tsv", "big\tlong\t4096\ta.txt\n");
  auto r = BuildWorkload(*model, o_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().ToString().find("prompt big: source a.txt gives"), std::string::npos) << r.status().ToString();
}

Prompt StoryPrompt(const model::Model& m) {
  const std::vector<int> t = engine::testing::PatternTokens(224, 7, 3, /*bos=*/true);
  Prompt p;
  p.id = "story";
  p.context.assign(t.begin(), t.begin() + 160);
  p.continuation.assign(t.begin() + 160, t.end());
  p.docs = {p.context};
  (void)m;
  return p;
}

TEST(Protocol, ExactCacheGivesNoChangeAndNoiseGivesSome) {
  REQUIRE_MODEL();
  ProtocolOptions o;
  o.greedy_tokens = 16;
  o.block_tokens = 32;
  o.threads = 1;
  auto e = PromptEvaluator::Create(*model, StoryPrompt(*model), o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const PromptResult& ref = (*e)->reference();
  EXPECT_EQ(ref.scored, 64u);
  EXPECT_EQ(ref.greedy_common, 16u);
  EXPECT_GT(ref.filter_scored, 0u);
  auto same = (*e)->Evaluate(nullptr);
  ASSERT_TRUE(same.ok()) << same.status().ToString();
  EXPECT_EQ(same->ppl_delta(), 0.0);
  EXPECT_EQ(same->kl(), 0.0);
  EXPECT_EQ(same->greedy_agreement(), 1.0);
  EXPECT_EQ(same->nll_full, ref.nll);
  // Every value of the context scaled: the output moves.
  auto noisy = (*e)->Evaluate([](model::KvCache& c, uint32_t n) {
    for (int l = 0; l < c.layers(); ++l)
      for (uint32_t p = 0; p < n; ++p)
        for (int i = 0; i < c.kv_dim(); ++i) c.v(l, p)[i] *= -1.0f, c.k(l, p)[i] *= 0.5f;
    return Status::Ok();
  });
  ASSERT_TRUE(noisy.ok());
  EXPECT_NE(noisy->ppl_delta(), 0.0);
  EXPECT_GT(noisy->kl(), 0.0);
  EXPECT_LT(noisy->greedy_agreement(), 1.0);
  // A transform's error is the evaluation's.
  auto bad = (*e)->Evaluate([](model::KvCache&, uint32_t) { return Status::Corruption("slice 3"); });
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().ToString().find("slice 3"), std::string::npos);
  // The exact cache is unchanged by evaluations.
  auto again = (*e)->Evaluate(nullptr);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->nll, ref.nll);
}

TEST(Protocol, RetrievalAnswerIsCheckedAgainstTheDecodedText) {
  REQUIRE_MODEL();
  ProtocolOptions o;
  o.greedy_tokens = 8;
  o.answer_tokens = 4;
  o.block_tokens = 32;
  o.threads = 1;
  Prompt p = StoryPrompt(*model);
  p.kind = PromptKind::kRetrieval;
  p.continuation.clear();
  p.question = {p.context[5], p.context[6]};
  // First learn what the exact cache answers, then ask for that text.
  p.answer = "\x01impossible";
  auto e = PromptEvaluator::Create(*model, p, o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ((*e)->reference().retrieval_correct, 0);
  const std::string said = (*e)->reference().answer_text;
  ASSERT_FALSE(said.empty());
  p.answer = said;
  auto e2 = PromptEvaluator::Create(*model, p, o);
  ASSERT_TRUE(e2.ok());
  EXPECT_EQ((*e2)->reference().retrieval_correct, 1);
  EXPECT_EQ((*e2)->reference().scored, 0u);
  EXPECT_TRUE(std::isnan((*e2)->reference().ppl_delta()));
}

TEST(Protocol, RejectsBadPrompts) {
  REQUIRE_MODEL();
  Prompt p = StoryPrompt(*model);
  p.context.push_back(model->config.vocab_size);
  auto e = PromptEvaluator::Create(*model, p, ProtocolOptions{});
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().ToString().find("outside the vocabulary"), std::string::npos);
  p = StoryPrompt(*model);
  p.context.resize(600);
  e = PromptEvaluator::Create(*model, p, ProtocolOptions{});
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().ToString().find("exceed the model's context"), std::string::npos);
}

TEST(Protocol, PoolingAndBootstrap) {
  std::vector<PromptResult> rs(4);
  for (size_t i = 0; i < rs.size(); ++i) {
    rs[i].scored = 100;
    rs[i].nll_full = 100;
    rs[i].nll = 100 + double(i);  // per-token NLL up by i/100
    rs[i].filter_scored = 99;
    rs[i].filter_nll_context = 50, rs[i].filter_nll_none = 200;  // the context helps
    rs[i].greedy_tokens = 64;
    rs[i].greedy_common = uint32_t(16 * i);
  }
  rs[3].filter_nll_none = 50;  // this one's context does not help: left out of ppl
  const Summary s = Summarize(rs);
  EXPECT_EQ(s.ppl_prompts, 3u);
  EXPECT_EQ(s.ppl_filtered_out, 1u);
  EXPECT_NEAR(s.ppl_delta, std::expm1(3.0 / 300), 1e-12);
  EXPECT_DOUBLE_EQ(s.greedy_agreement, (0 + 0.25 + 0.5 + 0.75) / 4);
  EXPECT_LE(s.greedy_lo, s.greedy_agreement);
  EXPECT_GE(s.greedy_hi, s.greedy_agreement);
  EXPECT_LT(s.greedy_lo, s.greedy_hi);
  EXPECT_TRUE(std::isnan(s.retrieval_accuracy));
  // Deterministic, and a constant statistic has a point interval.
  const Interval a = BootstrapInterval(10, [](std::span<const size_t> idx) { return double(idx.size()); });
  EXPECT_EQ(a.lo, 10);
  EXPECT_EQ(a.hi, 10);
  auto mean = [](std::span<const size_t> idx) {
    double s = 0;
    for (size_t i : idx) s += double(i);
    return s / double(idx.size());
  };
  const Interval b1 = BootstrapInterval(20, mean, 500, 7), b2 = BootstrapInterval(20, mean, 500, 7);
  EXPECT_EQ(b1.lo, b2.lo);
  EXPECT_EQ(b1.hi, b2.hi);
  EXPECT_LT(b1.lo, 9.5);
  EXPECT_GT(b1.hi, 9.5);
}

}  // namespace
}  // namespace flatkv::eval
