// Tests for the forward pass and KvCache against golden values made
// independently (shared/data/models/stories260K_ref*, computed in double by a
// Python checker), and for bit-identical results however the tokens are
// chunked, paged or restored.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "model/kv_cache.h"
#include "model/model.h"
#include "model/transformer.h"
#include "testing/test_util.h"

namespace flatkv::model {
namespace {

using ::flatkv::testing::ReadFile;
using ::flatkv::testing::ModelDataDir;
using ::flatkv::testing::SharedDataDir;

std::string ModelPath(const std::string& name) { return SharedDataDir() + "/models/" + name; }

std::vector<float> Floats(const std::string& bytes) {
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

// Just enough JSON for stories260K_ref.json: an array of ints and a string.
std::vector<int> JsonInts(const std::string& json, const std::string& key) {
  std::vector<int> out;
  size_t at = json.find("\"" + key + "\"");
  if (at == std::string::npos) return out;
  at = json.find('[', at);
  const size_t end = json.find(']', at);
  std::istringstream in(json.substr(at + 1, end - at - 1));
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoi(item));
  return out;
}

std::string JsonString(const std::string& json, const std::string& key) {
  std::string out;
  size_t at = json.find("\"" + key + "\"");
  if (at == std::string::npos) return out;
  at = json.find('"', json.find(':', at)) + 1;
  for (; at < json.size() && json[at] != '"'; ++at) {
    if (json[at] != '\\') {
      out += json[at];
      continue;
    }
    const char e = json[++at];
    if (e == 'n') out += '\n';
    else if (e == 't') out += '\t';
    else if (e == 'u') {  // ASCII escapes only in this file
      out += static_cast<char>(std::stoi(json.substr(at + 1, 4), nullptr, 16));
      at += 4;
    } else out += e;
  }
  return out;
}

// K and V of every layer and position below `n`, position-major, so caches
// with different block sizes compare directly.
std::vector<float> DumpKv(const KvCache& cache, uint32_t n) {
  std::vector<float> out;
  for (int l = 0; l < cache.layers(); ++l) {
    for (uint32_t p = 0; p < n; ++p) out.insert(out.end(), cache.k(l, p), cache.k(l, p) + cache.kv_dim());
    for (uint32_t p = 0; p < n; ++p) out.insert(out.end(), cache.v(l, p), cache.v(l, p) + cache.kv_dim());
  }
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

int Argmax(const std::vector<float>& v) { return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin()); }

class TransformerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string json, logits, kv;
    if (!ReadFile(ModelPath("stories260K_ref.json"), &json) || !ReadFile(ModelPath("stories260K_ref_logits.bin"), &logits) ||
        !ReadFile(ModelPath("stories260K_ref_kv.bin"), &kv))
      return;
    // The model itself is bundled (data/models); the reference tensors are shared data.
    auto m = LoadLlama2c(ModelDataDir() + "/stories260K.bin", ModelDataDir() + "/tok512.bin");
    if (!m.ok()) {
      load_error_ = new std::string(m.status().ToString());
      return;
    }
    model_ = new Model(std::move(m).value());
    tokens_fed_ = new std::vector<int>(JsonInts(json, "tokens_fed"));
    greedy_next_ = new std::vector<int>(JsonInts(json, "greedy_next_tokens"));
    greedy_text_ = new std::string(JsonString(json, "greedy_text"));
    ref_logits_ = new std::vector<float>(Floats(logits));
    ref_kv_ = new std::vector<float>(Floats(kv));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete tokens_fed_;
    delete greedy_next_;
    delete greedy_text_;
    delete ref_logits_;
    delete ref_kv_;
    delete load_error_;
    model_ = nullptr;
    load_error_ = nullptr;
  }
  void SetUp() override {
    if (load_error_ != nullptr) FAIL() << *load_error_;
    if (model_ == nullptr) {
      GTEST_SKIP() << "shared data not found: " << ModelPath("stories260K_ref.json")
                   << " (and _ref_logits.bin, _ref_kv.bin; set FLATKV_SHARED_DATA)";
    }
    ASSERT_EQ(tokens_fed_->size(), 64u);
    ASSERT_EQ(greedy_next_->size(), 64u);
    ASSERT_EQ(ref_logits_->size(), 64u * 512);
    ASSERT_EQ(ref_kv_->size(), 2u * 5 * 64 * 32);
  }

  // Runs the 64 reference tokens in chunks of `chunk` (the last may be
  // shorter); returns the last logits, and the KV in *kv.
  std::vector<float> RunChunked(Transformer& tr, KvCache& cache, size_t chunk, std::vector<float>* kv) {
    std::vector<float> logits(512);
    const std::vector<int>& toks = *tokens_fed_;
    for (size_t p = 0; p < toks.size(); p += chunk) {
      const size_t n = std::min(chunk, toks.size() - p);
      tr.Forward(std::span<const int>(toks).subspan(p, n), static_cast<uint32_t>(p), cache, logits.data());
    }
    if (kv != nullptr) *kv = DumpKv(cache, static_cast<uint32_t>(toks.size()));
    return logits;
  }

  static Model* model_;
  static std::vector<int>* tokens_fed_;
  static std::vector<int>* greedy_next_;
  static std::string* greedy_text_;
  static std::vector<float>* ref_logits_;
  static std::vector<float>* ref_kv_;
  static std::string* load_error_;
};

Model* TransformerTest::model_ = nullptr;
std::vector<int>* TransformerTest::tokens_fed_ = nullptr;
std::vector<int>* TransformerTest::greedy_next_ = nullptr;
std::string* TransformerTest::greedy_text_ = nullptr;
std::vector<float>* TransformerTest::ref_logits_ = nullptr;
std::vector<float>* TransformerTest::ref_kv_ = nullptr;
std::string* TransformerTest::load_error_ = nullptr;

TEST_F(TransformerTest, MatchesReferenceLogitsAndKv) {
  Transformer tr(*model_);
  KvCache cache(model_->config, 16, 64);
  std::vector<float> logits(512);
  double max_logit_diff = 0;
  for (uint32_t p = 0; p < 64; ++p) {
    const int tok = (*tokens_fed_)[p];
    tr.Forward({&tok, 1}, p, cache, logits.data());
    for (int i = 0; i < 512; ++i)
      max_logit_diff = std::max(max_logit_diff, std::fabs(double(logits[i]) - (*ref_logits_)[p * 512 + i]));
    EXPECT_EQ(Argmax(logits), (*greedy_next_)[p]) << "position " << p;
  }
  // Reference layout: K[layer][pos][kv_dim], then V likewise.
  double max_k_diff = 0, max_v_diff = 0;
  for (int l = 0; l < 5; ++l) {
    for (uint32_t p = 0; p < 64; ++p) {
      for (int i = 0; i < 32; ++i) {
        const size_t at = (size_t(l) * 64 + p) * 32 + i;
        max_k_diff = std::max(max_k_diff, std::fabs(double(cache.k(l, p)[i]) - (*ref_kv_)[at]));
        max_v_diff = std::max(max_v_diff, std::fabs(double(cache.v(l, p)[i]) - (*ref_kv_)[5 * 64 * 32 + at]));
      }
    }
  }
  std::printf("max abs diff vs reference: logits %.3g, K %.3g, V %.3g\n", max_logit_diff, max_k_diff, max_v_diff);
  RecordProperty("max_logit_diff", std::to_string(max_logit_diff));
  RecordProperty("max_k_diff", std::to_string(max_k_diff));
  RecordProperty("max_v_diff", std::to_string(max_v_diff));
  EXPECT_LT(max_logit_diff, 1e-3);
  EXPECT_LT(max_k_diff, 1e-4);
  EXPECT_LT(max_v_diff, 1e-4);
}

TEST_F(TransformerTest, GreedyDecodeFromBosTellsTheStory) {
  Transformer tr(*model_);
  KvCache cache(model_->config, 64, 64);
  std::vector<float> logits(512);
  Sampler greedy(512, 0.0f, 0.9f, 42);
  int tok = model_->tokenizer->bos_id();
  std::vector<int> next;
  std::string text;
  for (uint32_t p = 0; p < 64; ++p) {
    tr.Forward({&tok, 1}, p, cache, logits.data());
    const int n = greedy.Sample(logits);
    next.push_back(n);
    text += model_->tokenizer->Decode(tok, n);
    tok = n;
  }
  EXPECT_EQ(next, *greedy_next_);
  EXPECT_EQ(text, *greedy_text_);
  EXPECT_EQ(text.rfind(
                "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, "
                "she saw a big, red ball. She wanted to play with it, but it was too high.",
                0),
            0u)
      << text;
}

TEST_F(TransformerTest, ChunkingPagingAndOrderDoNotChangeABit) {
  std::vector<float> base_kv;
  Transformer base_tr(*model_);
  KvCache base_cache(model_->config, 16, 64);
  const std::vector<float> base_logits = RunChunked(base_tr, base_cache, 1, &base_kv);

  for (uint32_t block : {1u, 5u, 16u, 64u}) {
    for (size_t chunk : {1, 3, 7, 16, 64}) {
      for (bool fresh : {true, false}) {
        // A fresh Transformer, or one whose scratch already grew for 64 tokens.
        std::unique_ptr<Transformer> own;
        Transformer* tr = &base_tr;
        if (fresh) {
          own = std::make_unique<Transformer>(*model_);
          tr = own.get();
        }
        KvCache cache(model_->config, block, 64);
        std::vector<float> kv;
        const std::vector<float> logits = RunChunked(*tr, cache, chunk, &kv);
        EXPECT_TRUE(SameBits(logits, base_logits)) << "block " << block << " chunk " << chunk;
        EXPECT_TRUE(SameBits(kv, base_kv)) << "block " << block << " chunk " << chunk;
        if (block == 16) {  // same paging: the pages themselves are identical
          for (int l = 0; l < 5; ++l) {
            for (uint32_t b = 0; b < 4; ++b) {
              auto x = cache.PageBytes(l, b), y = base_cache.PageBytes(l, b);
              ASSERT_EQ(x.size(), y.size());
              EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size()), 0) << "layer " << l << " block " << b;
            }
          }
        }
      }
    }
  }
  // Uneven chunks too.
  Transformer tr(*model_);
  KvCache cache(model_->config, 16, 64);
  std::vector<float> logits(512);
  const std::vector<int>& toks = *tokens_fed_;
  uint32_t p = 0;
  for (size_t n : {2, 13, 1, 30, 18}) {
    tr.Forward(std::span<const int>(toks).subspan(p, n), p, cache, logits.data());
    p += static_cast<uint32_t>(n);
  }
  ASSERT_EQ(p, 64u);
  EXPECT_TRUE(SameBits(logits, base_logits));
  EXPECT_TRUE(SameBits(DumpKv(cache, 64), base_kv));
}

TEST_F(TransformerTest, LayerMajorApiMatchesForward) {
  Transformer tr(*model_);
  KvCache cache(model_->config, 16, 64);
  std::vector<float> base_kv;
  Transformer base_tr(*model_);
  KvCache base_cache(model_->config, 16, 64);
  const std::vector<float> base_logits = RunChunked(base_tr, base_cache, 64, &base_kv);

  // Two chunks, each Embed -> Layer(0..4) -> Logits, as an engine drives it.
  const std::vector<int>& toks = *tokens_fed_;
  std::vector<float> x(64 * 64), logits(512);
  for (uint32_t p0 : {0u, 40u}) {
    const uint32_t n = p0 == 0 ? 40 : 24;
    tr.Embed(std::span<const int>(toks).subspan(p0, n), x.data());
    for (int l = 0; l < 5; ++l) tr.Layer(l, p0, n, x.data(), cache);
    tr.Logits(x.data() + (n - 1) * 64, logits.data());
  }
  EXPECT_TRUE(SameBits(logits, base_logits));
  EXPECT_TRUE(SameBits(DumpKv(cache, 64), base_kv));
}

// Logits of a chunk's n rows in one call (the classifier read once per token
// tile) give each row the bits of a one-row call.
TEST_F(TransformerTest, LogitsOfManyRowsMatchOneRowAtATime) {
  Transformer tr(*model_);
  KvCache cache(model_->config, 16, 64);
  const std::vector<int>& toks = *tokens_fed_;
  constexpr uint32_t kN = 37;
  std::vector<float> x(kN * 64);
  tr.Embed(std::span<const int>(toks).subspan(0, kN), x.data());
  for (int l = 0; l < 5; ++l) tr.Layer(l, 0, kN, x.data(), cache);
  std::vector<float> many(size_t{kN} * 512), one(size_t{kN} * 512);
  tr.Logits(x.data(), many.data(), kN);
  for (uint32_t i = 0; i < kN; ++i) tr.Logits(x.data() + size_t{i} * 64, one.data() + size_t{i} * 512);
  EXPECT_TRUE(SameBits(many, one));
}

TEST_F(TransformerTest, RestoredPrefixGivesTheSameContinuation) {
  // Compute 32 positions, move their pages to a fresh cache (as the store
  // does), continue there: logits and KV must match an uninterrupted run.
  std::vector<float> base_kv;
  Transformer base_tr(*model_);
  KvCache base_cache(model_->config, 16, 64);
  const std::vector<float> base_logits = RunChunked(base_tr, base_cache, 64, &base_kv);

  const std::vector<int>& toks = *tokens_fed_;
  Transformer tr(*model_);
  KvCache first(model_->config, 16, 64);
  std::vector<float> logits(512);
  tr.Forward(std::span<const int>(toks).subspan(0, 40), 0, first, logits.data());  // 8 more than restored
  KvCache restored(model_->config, 16, 64);
  for (int l = 0; l < 5; ++l) {
    for (uint32_t b = 0; b < 2; ++b) {
      auto src = first.PageBytes(l, b), dst = restored.PageBytes(l, b);
      ASSERT_EQ(src.size(), 16u * 2 * 32 * 4);
      std::memcpy(dst.data(), src.data(), src.size());
    }
  }
  Transformer tr2(*model_);
  tr2.Forward(std::span<const int>(toks).subspan(32, 32), 32, restored, logits.data());
  EXPECT_TRUE(SameBits(logits, base_logits));
  EXPECT_TRUE(SameBits(DumpKv(restored, 64), base_kv));
}

TEST_F(TransformerTest, KernelsAndThreadsDoNotChangeResults) {
  // The scalar kernels on one thread are the reference; every compiled fast
  // path on 1 and 3 threads, whole prompt and uneven chunks, gives its bits.
  std::vector<float> base_kv;
  Transformer base_tr(*model_, {.threads = 1, .simd = SimdLevel::kScalar});
  ASSERT_EQ(base_tr.simd(), SimdLevel::kScalar);
  KvCache base_cache(model_->config, 16, 64);
  const std::vector<float> base_logits = RunChunked(base_tr, base_cache, 64, &base_kv);
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (int(level) > int(DetectedSimd())) continue;
    for (int threads : {1, 3}) {
      for (size_t chunk : {size_t{64}, size_t{7}}) {
        Transformer tr(*model_, {.threads = threads, .simd = level});
        EXPECT_EQ(tr.threads(), threads);
        KvCache cache(model_->config, 16, 64);
        std::vector<float> kv;
        const std::vector<float> logits = RunChunked(tr, cache, chunk, &kv);
        const std::string what = std::string(SimdName(tr.simd())) + ", " + std::to_string(threads) + " threads, chunk " +
                                 std::to_string(chunk);
        EXPECT_TRUE(SameBits(logits, base_logits)) << what;
        EXPECT_TRUE(SameBits(kv, base_kv)) << what;
      }
    }
  }
}

TEST(KvCacheTest, LayoutFollowsTheHeader) {
  Config c{64, 172, 5, 8, 4, 512, 512};
  KvCache cache(c, 16, 40);  // rounds up to 48 positions
  EXPECT_EQ(cache.max_positions(), 48u);
  EXPECT_EQ(cache.block_tokens(), 16u);
  EXPECT_EQ(cache.kv_dim(), 32);
  EXPECT_EQ(cache.layers(), 5);
  EXPECT_EQ(cache.page_bytes(), 2u * 16 * 32 * 4);
  // Page (layer, block): K rows of the block's positions, then V rows.
  auto page = cache.PageBytes(2, 1);
  auto* base = reinterpret_cast<float*>(page.data());
  EXPECT_EQ(cache.k(2, 16), base);
  EXPECT_EQ(cache.k(2, 17), base + 32);
  EXPECT_EQ(cache.v(2, 16), base + 16 * 32);
  EXPECT_EQ(cache.v(2, 31), base + 16 * 32 + 15 * 32);
  // Pages are [layer][block]: block 2 of layer 2 follows block 1, and one
  // layer's pages are contiguous and 4 KiB aligned.
  EXPECT_EQ(reinterpret_cast<float*>(cache.PageBytes(2, 2).data()), base + 2 * 16 * 32);
  EXPECT_EQ(cache.v(4, 47) + 32, reinterpret_cast<float*>(cache.PageBytes(4, 2).data()) + 2 * 16 * 32);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(cache.PageBytes(0, 0).data()) % 4096, 0u);
  for (int l = 0; l < 5; ++l) EXPECT_EQ(cache.k(l, 0)[0], 0.0f);
  KvCache exact(c, 64, 64);
  EXPECT_EQ(exact.max_positions(), 64u);
}

}  // namespace
}  // namespace flatkv::model
