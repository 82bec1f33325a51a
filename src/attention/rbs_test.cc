// RBS-Attention: the block statistics, the two-branch mask, the block-sparse
// kernels (scalar reference against a double-precision dense attention with
// every block selected; AVX2 against the scalar one on awkward sizes) and
// the prefill hook on the bundled stories260K model.
#include "attention/rbs.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "attention/rbs_synthetic.h"
#include "engine/engine_test_util.h"
#include "model/kv_cache.h"
#include "model/transformer.h"

namespace flatkv::attention {
namespace {

std::vector<float> Random(size_t n, uint64_t seed, float stddev = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = g(rng);
  return v;
}

// Dense causal attention of query rows at pos[r] over keys 0..pos[r] of k, v ([t][d]), in double.
void DenseRef(const float* q, const uint32_t* pos, uint32_t rows, const float* k, const float* v, int d, float scale,
              std::vector<double>& o, std::vector<double>& lse) {
  o.assign(uint64_t(rows) * d, 0.0);
  lse.assign(rows, 0.0);
  for (uint32_t r = 0; r < rows; ++r) {
    std::vector<double> s(pos[r] + 1);
    double m = -1e300;
    for (uint32_t t = 0; t <= pos[r]; ++t) {
      double dot = 0;
      for (int x = 0; x < d; ++x) dot += double(q[uint64_t(r) * d + x]) * k[uint64_t(t) * d + x];
      s[t] = dot * scale;
      m = std::max(m, s[t]);
    }
    double z = 0;
    for (uint32_t t = 0; t <= pos[r]; ++t) {
      const double p = std::exp(s[t] - m);
      z += p;
      for (int x = 0; x < d; ++x) o[uint64_t(r) * d + x] += p * v[uint64_t(t) * d + x];
    }
    for (int x = 0; x < d; ++x) o[uint64_t(r) * d + x] /= z;
    lse[r] = m + std::log(z);
  }
}

struct Case {
  int d;
  uint32_t block, n_keys, pos0, rows;
};

BlockAttendArgs Args(const float* q, const uint32_t* pos, const Case& c, const float* k, const float* v,
                     const std::vector<uint32_t>& blocks, float* o, float* lse) {
  BlockAttendArgs a;
  a.q = q;
  a.q_stride = c.d;
  a.pos = pos;
  a.rows = c.rows;
  a.d = c.d;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  a.k = BlockRows{k, uint64_t(c.block) * c.d, uint64_t(c.d)};
  a.v = BlockRows{v, uint64_t(c.block) * c.d, uint64_t(c.d)};
  a.block = c.block;
  a.blocks = blocks.data();
  a.n_blocks = static_cast<uint32_t>(blocks.size());
  a.o = o;
  a.o_stride = c.d;
  a.lse = lse;
  return a;
}

// Awkward sizes: head dims not a multiple of 8 or 64, blocks not a multiple
// of 8, rows that start mid-block and end early, keys ending mid-block.
const Case kCases[] = {{64, 64, 300, 192, 64}, {64, 64, 300, 256, 37}, {24, 16, 100, 83, 13}, {72, 40, 250, 200, 40},
                       {13, 5, 61, 50, 5},     {8, 64, 64, 0, 64},     {128, 32, 97, 64, 33}, {64, 64, 1, 0, 1}};

TEST(RbsKernelsTest, EveryBlockSelectedIsDenseAttention) {
  std::vector<const RbsKernels*> kernels{&RbsScalarKernels()};
  if (DetectedSimd() >= SimdLevel::kAvx2 && RbsAvx2Kernels() != nullptr) kernels.push_back(RbsAvx2Kernels());
  for (const Case& c : kCases) {
    const auto k = Random(uint64_t(c.n_keys + c.block) * c.d, 1, 1.5f), v = Random(k.size(), 2);
    const auto q = Random(uint64_t(c.rows) * c.d, 3, 1.5f);
    std::vector<uint32_t> pos(c.rows);
    std::iota(pos.begin(), pos.end(), c.pos0);
    std::vector<uint32_t> all(pos.back() / c.block + 1);
    std::iota(all.begin(), all.end(), 0u);
    std::vector<double> ro, rlse;
    DenseRef(q.data(), pos.data(), c.rows, k.data(), v.data(), c.d, 1.0f / std::sqrt(float(c.d)), ro, rlse);
    for (const RbsKernels* kern : kernels) {
      std::vector<float> o(uint64_t(c.rows) * c.d, 7.0f), lse(c.rows);
      BlockAttendScratch scratch;
      kern->attend(Args(q.data(), pos.data(), c, k.data(), v.data(), all, o.data(), lse.data()), scratch);
      for (uint32_t r = 0; r < c.rows; ++r) {
        EXPECT_NEAR(lse[r], rlse[r], 1e-4 * std::max(1.0, std::abs(rlse[r]))) << "d " << c.d << " row " << r;
        for (int x = 0; x < c.d; ++x)
          ASSERT_NEAR(o[uint64_t(r) * c.d + x], ro[uint64_t(r) * c.d + x], 2e-5)
              << "level " << int(kern->level) << " d " << c.d << " block " << c.block << " row " << r << " col " << x;
      }
    }
  }
}

TEST(RbsKernelsTest, Avx2MatchesScalarOnSparseMasks) {
  if (DetectedSimd() < SimdLevel::kAvx2 || RbsAvx2Kernels() == nullptr) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937_64 rng(9);
  for (const Case& c : kCases) {
    const auto k = Random(uint64_t(c.n_keys + c.block) * c.d, 4, 2.0f), v = Random(k.size(), 5);
    const auto q = Random(uint64_t(c.rows) * c.d, 6, 2.0f);
    std::vector<uint32_t> pos(c.rows);
    std::iota(pos.begin(), pos.end(), c.pos0);
    const uint32_t diag = pos.back() / c.block;
    std::vector<uint32_t> some;
    for (uint32_t j = 0; j < diag; ++j)
      if (rng() % 3 == 0) some.push_back(j);
    some.push_back(diag);
    std::vector<float> o1(uint64_t(c.rows) * c.d), o2(o1.size()), l1(c.rows), l2(c.rows);
    BlockAttendScratch s1, s2;
    RbsScalarKernels().attend(Args(q.data(), pos.data(), c, k.data(), v.data(), some, o1.data(), l1.data()), s1);
    RbsAvx2Kernels()->attend(Args(q.data(), pos.data(), c, k.data(), v.data(), some, o2.data(), l2.data()), s2);
    for (size_t i = 0; i < o1.size(); ++i) ASSERT_NEAR(o1[i], o2[i], 1e-5) << "d " << c.d << " i " << i;
    for (uint32_t r = 0; r < c.rows; ++r) {
      if (std::isinf(l1[r])) {  // a row that sees no selected key (rows spanning two blocks)
        EXPECT_TRUE(std::isinf(l2[r]) && l2[r] < 0) << r;
        continue;
      }
      EXPECT_NEAR(l1[r], l2[r], 1e-5 * std::max(1.0f, std::abs(l1[r])));
    }
    std::vector<float> c1(diag + 1), c2(diag + 1), cent = Random(uint64_t(diag + 1) * c.d, 7);
    RbsScalarKernels().dots(q.data(), cent.data(), diag + 1, c.d, 0.125f, c1.data());
    RbsAvx2Kernels()->dots(q.data(), cent.data(), diag + 1, c.d, 0.125f, c2.data());
    for (uint32_t j = 0; j <= diag; ++j) EXPECT_NEAR(c1[j], c2[j], 1e-4);
  }
}

TEST(RbsKernelsTest, LseOfASubsetIsTheKeptMass) {
  // exp(lse_subset - lse_all) equals the dense softmax mass of the subset's keys.
  const Case c{32, 16, 128, 112, 16};
  const auto k = Random(uint64_t(c.n_keys) * c.d, 11, 1.5f), v = Random(k.size(), 12), q = Random(uint64_t(c.rows) * c.d, 13);
  std::vector<uint32_t> pos(c.rows);
  std::iota(pos.begin(), pos.end(), c.pos0);
  const std::vector<uint32_t> subset{0, 3, 7}, all{0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<float> o(uint64_t(c.rows) * c.d), ls(c.rows), la(c.rows);
  BlockAttendScratch sc;
  RbsScalarKernels().attend(Args(q.data(), pos.data(), c, k.data(), v.data(), subset, o.data(), ls.data()), sc);
  RbsScalarKernels().attend(Args(q.data(), pos.data(), c, k.data(), v.data(), all, o.data(), la.data()), sc);
  for (uint32_t r = 0; r < c.rows; ++r) {
    double z = 0, kept = 0;
    for (uint32_t t = 0; t <= pos[r]; ++t) {
      double dot = 0;
      for (int x = 0; x < c.d; ++x) dot += double(q[uint64_t(r) * c.d + x]) * k[uint64_t(t) * c.d + x];
      const double p = std::exp(dot / std::sqrt(double(c.d)));
      z += p;
      const uint32_t j = t / c.block;
      if (j == 0 || j == 3 || j == 7) kept += p;
    }
    EXPECT_NEAR(std::exp(double(ls[r]) - la[r]), kept / z, 1e-5);
  }
}

TEST(RbsStatsTest, CentroidsRadiiAndIncrementalUpdate) {
  const int d = 12;
  const uint32_t B = 8, n = 45;
  const auto k = Random(uint64_t(n + B) * d, 21);
  const BlockRows rows{k.data(), uint64_t(B) * d, uint64_t(d)};
  KeyBlockStats once, grown;
  UpdateKeyBlockStats(rows, n, d, B, once);
  for (uint32_t m : {3u, 8u, 9u, 30u, 45u}) UpdateKeyBlockStats(rows, m, d, B, grown);
  ASSERT_EQ(once.blocks(), 6u);
  EXPECT_EQ(once.centroid, grown.centroid);
  EXPECT_EQ(once.radius, grown.radius);
  for (uint32_t j = 0; j < once.blocks(); ++j) {
    const uint32_t nk = std::min(B, n - j * B);
    std::vector<double> c(d, 0.0);
    for (uint32_t t = 0; t < nk; ++t)
      for (int x = 0; x < d; ++x) c[x] += k[(uint64_t(j) * B + t) * d + x] / nk;
    double r = 0;
    for (uint32_t t = 0; t < nk; ++t) {
      double dist = 0;
      for (int x = 0; x < d; ++x) dist += std::pow(k[(uint64_t(j) * B + t) * d + x] - c[x], 2);
      r = std::max(r, std::sqrt(dist));
    }
    for (int x = 0; x < d; ++x) EXPECT_NEAR(once.centroid[uint64_t(j) * d + x], c[x], 1e-5);
    EXPECT_NEAR(once.radius[j], r, 1e-4);
  }
}

// Keys with one strong "needle" hidden in block 5 that the query block seeks,
// and blocks 6..8 whose every key is mildly relevant.
struct NeedleCase {
  static constexpr int d = 32;
  static constexpr uint32_t B = 16, n = 160, qb = 9;
  std::vector<float> k = Random(uint64_t(n) * d, 31, 0.5f);
  std::vector<float> q = Random(uint64_t(B) * d, 32, 0.5f);
  std::vector<uint32_t> pos;
  KeyBlockStats stats;
  NeedleCase() {
    std::vector<float> dir = Random(d, 33);
    float n2 = 0;
    for (float x : dir) n2 += x * x;
    for (float& x : dir) x /= std::sqrt(n2);
    for (int x = 0; x < d; ++x) k[(5 * B + 7) * uint64_t(d) + x] += 12.0f * dir[x];
    // Blocks 6..8 are uniformly relevant (logit 2 for every key): they lead the base branch.
    std::vector<float> topic = Random(d, 34);
    n2 = 0;
    for (float x : topic) n2 += x * x;
    for (float& x : topic) x /= std::sqrt(n2);
    for (uint32_t t = 6 * B; t < 9 * B; ++t)
      for (int x = 0; x < d; ++x) k[uint64_t(t) * d + x] += 2.83f * topic[x];
    for (uint32_t r = 0; r < B; ++r)
      for (int x = 0; x < d; ++x) q[uint64_t(r) * d + x] += 4.0f * dir[x] + 4.0f * topic[x];
    for (uint32_t r = 0; r < B; ++r) pos.push_back(qb * B + r);
    UpdateKeyBlockStats(BlockRows{k.data(), uint64_t(B) * d, uint64_t(d)}, n, d, B, stats);
  }
  std::vector<uint32_t> Select(RbsMode mode, float base_mass, MaskCounts* counts = nullptr) {
    RbsOptions o;
    o.block = B;
    o.mode = mode;
    o.base_mass = base_mass;
    o.rescue_share = 0.05f;
    MaskScratch sc;
    std::vector<uint32_t> out;
    MaskCounts local;
    SelectBlocks(q.data(), d, pos.data(), B, stats, o, 1.0f / std::sqrt(float(d)), RbsScalarKernels(), sc, out,
                 counts ? *counts : local);
    return out;
  }
};

bool Has(const std::vector<uint32_t>& v, uint32_t j) { return std::find(v.begin(), v.end(), j) != v.end(); }

TEST(RbsMaskTest, BranchesAndForcedBlocks) {
  NeedleCase c;
  const auto dense = c.Select(RbsMode::kDense, 0.5f);
  EXPECT_EQ(dense.size(), NeedleCase::qb + 1);
  EXPECT_EQ(c.Select(RbsMode::kRbs, 1.0f), dense);  // covering all the mass takes every block
  MaskCounts counts;
  const auto rbs = c.Select(RbsMode::kRbs, 0.3f, &counts);
  const auto base = c.Select(RbsMode::kBaseOnly, 0.3f);
  EXPECT_TRUE(std::is_sorted(rbs.begin(), rbs.end()));
  for (const auto* m : {&rbs, &base}) {
    EXPECT_TRUE(Has(*m, 0));                // sinks
    EXPECT_TRUE(Has(*m, NeedleCase::qb));   // diagonal
  }
  // The needle's block: diluted for the base branch, rescued by its radius.
  EXPECT_FALSE(Has(base, 5));
  EXPECT_TRUE(Has(rbs, 5));
  EXPECT_GE(counts.rescued, 1u);
  EXPECT_EQ(counts.selected, rbs.size());
  EXPECT_EQ(counts.causal, NeedleCase::qb + 1);
  // Rescue off at equal density: as many blocks as RBS, by the base order alone.
  const auto matched = c.Select(RbsMode::kBaseMatched, 0.3f);
  EXPECT_EQ(matched.size(), rbs.size());
}

TEST(RbsMaskTest, RejectsBadOptions) {
  RbsOptions o;
  o.block = 0;
  EXPECT_FALSE(o.Validate().ok());
  o = {};
  o.base_mass = 1.5f;
  EXPECT_NE(o.Validate().message().find("base_mass"), std::string::npos);
  o = {};
  o.rescue_share = 0;
  EXPECT_NE(o.Validate().message().find("rescue_share"), std::string::npos);
}

TEST(RbsSyntheticTest, RescueFindsTheNeedlesAtEqualDensity) {
  PrefillSyntheticOptions so;
  so.n_tokens = 4096;
  so.heads = 2;
  const std::vector<uint32_t> qblocks{40, 63};
  const PrefillSynthetic s = MakePrefillSynthetic(so, qblocks);
  const int d = so.head_dim;
  const float scale = 1.0f / std::sqrt(float(d));
  double err[2] = {0, 0}, ref = 0;
  uint64_t selected[2] = {0, 0};
  for (int h = 0; h < s.heads; ++h) {
    const BlockRows k{s.head_k(h), uint64_t(so.block) * d, uint64_t(d)}, v{s.head_v(h), uint64_t(so.block) * d, uint64_t(d)};
    KeyBlockStats st;
    UpdateKeyBlockStats(k, so.n_tokens, d, so.block, st);
    for (size_t b = 0; b < qblocks.size(); ++b) {
      const float* q = s.q.data() + (uint64_t(h) * qblocks.size() * so.block + b * so.block) * d;
      std::vector<uint32_t> pos(so.block);
      std::iota(pos.begin(), pos.end(), qblocks[b] * so.block);
      std::vector<uint32_t> all(qblocks[b] + 1);
      std::iota(all.begin(), all.end(), 0u);
      std::vector<float> od(uint64_t(so.block) * d), os(od.size());
      BlockAttendScratch sc;
      BlockAttendArgs a{q, uint64_t(d), pos.data(), so.block, d, scale, k, v, so.block, all.data(),
                        uint32_t(all.size()), od.data(), uint64_t(d), nullptr};
      RbsScalarKernels().attend(a, sc);
      for (float x : od) ref += double(x) * x;
      int i = 0;
      for (RbsMode mode : {RbsMode::kRbs, RbsMode::kBaseMatched}) {
        RbsOptions o;
        o.mode = mode;
        o.base_mass = 0.8f;
        MaskScratch ms;
        MaskCounts mc;
        std::vector<uint32_t> blocks;
        SelectBlocks(q, d, pos.data(), so.block, st, o, scale, RbsScalarKernels(), ms, blocks, mc);
        selected[i] += blocks.size();
        a.blocks = blocks.data();
        a.n_blocks = uint32_t(blocks.size());
        a.o = os.data();
        RbsScalarKernels().attend(a, sc);
        for (size_t x = 0; x < os.size(); ++x) err[i] += double(os[x] - od[x]) * (os[x] - od[x]);
        ++i;
      }
    }
  }
  EXPECT_EQ(selected[0], selected[1]);
  EXPECT_LT(std::sqrt(err[0] / ref), 0.5 * std::sqrt(err[1] / ref)) << "rescue " << err[0] << " matched " << err[1];
}

TEST(RbsPrefillTest, DenseModeMatchesTheTransformerAndRbsKeepsMost) {
  const model::Model* m = engine::testing::Stories();
  ASSERT_NE(m, nullptr);
  const model::Config& c = m->config;
  const uint32_t B = 16;
  const std::vector<int> prompt = engine::testing::PatternTokens(200, 7);
  std::vector<float> ref(c.vocab_size), got(c.vocab_size);
  {
    model::Transformer t(*m);
    model::KvCache cache(c, B, 256);
    t.Forward(prompt, 0, cache, ref.data());
  }
  for (RbsMode mode : {RbsMode::kDense, RbsMode::kRbs}) {
    RbsOptions o;
    o.block = B;
    o.mode = mode;
    auto rbs = RbsPrefill::Create(c, o, B, 2, /*measure_dense=*/true);
    ASSERT_TRUE(rbs.ok()) << rbs.status().ToString();
    model::Transformer t(*m);
    t.set_attention_hook((*rbs)->Hook());
    model::KvCache cache(c, B, 256);
    // Two chunks, the second starting mid-block.
    t.Forward(std::span<const int>(prompt).first(70), 0, cache, got.data());
    t.Forward(std::span<const int>(prompt).subspan(70), 70, cache, got.data());
    const RbsRunStats& st = (*rbs)->stats();
    EXPECT_GT(st.mask.causal, 0u);
    EXPECT_GT(st.rows, 0u);
    if (mode == RbsMode::kDense) {
      EXPECT_DOUBLE_EQ(st.density(), 1.0);
      EXPECT_NEAR(st.retention(), 1.0, 1e-5);
      EXPECT_LT(st.rel_error(), 1e-5);
      for (int i = 0; i < c.vocab_size; ++i) ASSERT_NEAR(got[i], ref[i], 2e-3) << "logit " << i;
    } else {
      EXPECT_LE(st.density(), 1.0);
      EXPECT_GT(st.retention(), 0.5);
      EXPECT_LE(st.retention(), 1.0 + 1e-5);
    }
  }
}

TEST(RbsPrefillTest, RejectsAMismatchedCacheBlock) {
  const model::Model* m = engine::testing::Stories();
  ASSERT_NE(m, nullptr);
  RbsOptions o;
  o.block = 64;
  auto r = RbsPrefill::Create(m->config, o, 16, 1, false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("block_tokens (16)"), std::string::npos) << r.status().ToString();
}

}  // namespace
}  // namespace flatkv::attention
