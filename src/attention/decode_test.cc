// Decode kernels: SIMD == scalar on awkward sizes, online-softmax merging ==
// exact, Quest with a full budget == dense, and the certified sampler's
// estimator and certificate bookkeeping.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>

#include "attention/certified_sampler.h"
#include "attention/decode.h"
#include "attention/f16.h"
#include "attention/quest.h"
#include "attention/synthetic.h"

namespace flatkv::attention {
namespace {

std::vector<uint16_t> RandomHalves(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<uint16_t> out(n);
  for (auto& h : out) h = FloatToHalf(nd(rng));
  return out;
}

std::vector<float> RandomFloats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> out(n);
  for (auto& x : out) x = nd(rng);
  return out;
}

double RelErr(std::span<const float> a, std::span<const float> b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

TEST(AttentionDecodeTest, HalfConversionRoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
      continue;
    }
    ASSERT_EQ(FloatToHalf(f), h) << h;
  }
  EXPECT_EQ(FloatToHalf(1.0f + 0x1.0p-11f), 0x3C00);  // tie to even
  EXPECT_EQ(FloatToHalf(70000.0f), 0x7C00);
  EXPECT_EQ(HalfToFloat(0x0001), 0x1.0p-24f);
}

TEST(AttentionDecodeTest, SimdKernelsMatchScalarOnAwkwardSizes) {
  if (DetectedSimd() < SimdLevel::kAvx2) GTEST_SKIP() << "no AVX2";
  const DecodeKernels &s = ScalarKernels(), &v = Avx2Kernels();
  for (int d : {1, 7, 8, 13, 64, 128})
    for (int g : {1, 3, 4})
      for (uint32_t n : {1u, 5u, 33u}) {
        const auto k = RandomHalves(size_t(n) * d, n * 31 + d);
        const auto vv = RandomHalves(size_t(n) * d, n * 17 + d);
        const auto q = RandomFloats(size_t(g) * d, g + d);
        std::vector<float> sa(size_t(g) * n), sb(sa.size());
        s.scores(q.data(), g, k.data(), n, d, 0.3f, sa.data());
        v.scores(q.data(), g, k.data(), n, d, 0.3f, sb.data());
        for (size_t i = 0; i < sa.size(); ++i) ASSERT_NEAR(sa[i], sb[i], 1e-4f * (1 + std::fabs(sa[i])));
        EXPECT_NEAR(s.dot_row(q.data(), k.data(), d), v.dot_row(q.data(), k.data(), d), 1e-3f);
        auto ea = sa, eb = sa;
        s.exp_shift(ea.data(), static_cast<uint32_t>(ea.size()), 1.5f);
        v.exp_shift(eb.data(), static_cast<uint32_t>(eb.size()), 1.5f);
        for (size_t i = 0; i < ea.size(); ++i) ASSERT_NEAR(ea[i], eb[i], 2e-6f * (1 + ea[i]));
        std::vector<float> aa(size_t(g) * d, 0.5f), ab = aa;
        s.accumulate(ea.data(), n, g, vv.data(), n, d, aa.data());
        v.accumulate(ea.data(), n, g, vv.data(), n, d, ab.data());
        for (size_t i = 0; i < aa.size(); ++i) ASSERT_NEAR(aa[i], ab[i], 1e-4f * (1 + std::fabs(aa[i])));
        std::vector<float> w(n), r(n), vn(n);
        for (uint32_t i = 0; i < n; ++i) {
          w[i] = std::exp(-float(i % 9) * 1.7f);
          r[i] = 0.5f + i;
          vn[i] = 1.0f + 0.1f * i;
        }
        std::vector<uint8_t> la(n), lb(n);
        double za = 0, zb = 0, wa = 0, wb = 0, ba[256] = {}, bb[256] = {};
        s.sampler_pass(w.data(), r.data(), vn.data(), n, la.data(), &za, &wa, ba);
        v.sampler_pass(w.data(), r.data(), vn.data(), n, lb.data(), &zb, &wb, bb);
        EXPECT_EQ(la, lb);
        EXPECT_NEAR(za, zb, 1e-5 * za);
        for (int b = 0; b < 256; ++b) ASSERT_NEAR(ba[b], bb[b], 1e-9 * (1 + ba[b]));
      }
}

TEST(AttentionDecodeTest, SamplerPassLevelsAndBuckets) {
  // w r = 1 -> level 0; 0.5 -> 1; 0.3 -> 2 (0.3 >= 1/4); 0 -> beyond the grid.
  std::vector<float> w = {1.0f, 0.5f, 0.3f, 0.0f}, r(4, 1.0f), vn(4, 2.0f);
  std::vector<uint8_t> lev(4);
  double z = 0, wv = 0, b[256] = {};
  ScalarKernels().sampler_pass(w.data(), r.data(), vn.data(), 4, lev.data(), &z, &wv, b);
  EXPECT_EQ(lev, (std::vector<uint8_t>{0, 1, 2, 127}));
  EXPECT_NEAR(z, 1.8, 1e-6);
  EXPECT_NEAR(wv, 3.6, 1e-6);
  for (int i = 0; i < 256; ++i)
    if (b[i] != 0) {
      EXPECT_LE(std::bit_cast<float>(uint32_t(i) << 22), 1.0f);
    }
  EXPECT_NEAR(b[std::bit_cast<uint32_t>(0.3f) >> 22], 0.3 * 4, 1e-6);
}

SyntheticCache SmallCache(uint32_t n, uint64_t seed) {
  SyntheticOptions o;
  o.n_heads = 6;
  o.n_kv_heads = 2;
  o.head_dim = 40;  // not a multiple of 16: exercises the tails
  o.n_tokens = n;
  o.local = 64;
  o.heavy = 8;
  o.seed = seed;
  return MakeSyntheticCache(o);
}

TEST(AttentionDecodeTest, DenseMatchesExactForAnyChunkingAndThreadCount) {
  const SyntheticCache sc = SmallCache(1000, 1);
  const F16Cache c = sc.View(997);  // a prefix: head_stride > n_tokens
  std::vector<float> want(sc.q.size()), got(sc.q.size()), first(sc.q.size());
  ExactDecode(c, 6, sc.q, want);
  bool have_first = false;
  for (SimdLevel simd : {SimdLevel::kScalar, SimdLevel::kAvx2})
    for (uint32_t chunk : {1u, 7u, 100u, 997u, 4096u})
      for (int threads : {1, 3}) {
        DecodeOptions o;
        o.simd = simd;
        o.chunk_tokens = chunk;
        o.threads = threads;
        ASSERT_TRUE(DenseDecode(c, 6, sc.q, got, o).ok());
        EXPECT_LT(RelErr(got, want), 1e-5) << "chunk " << chunk;
        if (threads == 3) {
          EXPECT_EQ(0, std::memcmp(got.data(), first.data(), got.size() * 4)) << "thread count changed a bit";
        } else {
          first = got;
          have_first = true;
        }
      }
  EXPECT_TRUE(have_first);
}

TEST(AttentionDecodeTest, MergeOfPartialsIsTheExactSoftmax) {
  Partial a{1.0f, 2.0, {1.0f, 2.0f}}, b{3.0f, 1.0, {0.5f, -1.0f}}, empty;
  Partial m = a;
  MergePartial(m, b);
  EXPECT_FLOAT_EQ(m.m, 3.0f);
  EXPECT_NEAR(m.l, 2.0 * std::exp(-2.0) + 1.0, 1e-6);
  EXPECT_NEAR(m.acc[0], 1.0 * std::exp(-2.0) + 0.5, 1e-6);
  Partial e = empty;
  MergePartial(e, a);
  EXPECT_EQ(e.acc, a.acc);
  MergePartial(a, empty);
  EXPECT_EQ(a.l, 2.0);
}

TEST(AttentionDecodeTest, QuestWithAFullBudgetIsDense) {
  const SyntheticCache sc = SmallCache(1000, 2);
  const F16Cache c = sc.View(1000);
  auto ix = BuildQuestIndex(c, 16);
  ASSERT_TRUE(ix.ok());
  std::vector<float> dense(sc.q.size()), quest(sc.q.size()), exact(sc.q.size());
  ASSERT_TRUE(DenseDecode(c, 6, sc.q, dense).ok());
  QuestOptions qo;
  qo.token_budget = 1000;
  QuestStats st;
  ASSERT_TRUE(QuestDecode(c, *ix, 6, sc.q, quest, qo, &st).ok());
  EXPECT_EQ(st.tokens_read, 2000u);
  EXPECT_LT(RelErr(quest, dense), 1e-6);
  // A small budget still finds the sinks, heavy hitters and recent pages.
  qo.token_budget = 256;
  ASSERT_TRUE(QuestDecode(c, *ix, 6, sc.q, quest, qo, &st).ok());
  EXPECT_EQ(st.pages_read, 32u);
  ExactDecode(c, 6, sc.q, exact);
  EXPECT_LT(RelErr(quest, exact), 0.2);
  qo.token_budget = 0;  // at least the newest page
  EXPECT_TRUE(QuestDecode(c, *ix, 6, sc.q, quest, qo, &st).ok());
  EXPECT_EQ(st.pages_read, 2u);
  QuestIndex wrong = *ix;
  wrong.pages = 3;
  EXPECT_FALSE(QuestDecode(c, wrong, 6, sc.q, quest, qo).ok());
}

TEST(AttentionDecodeTest, QuestPageBoundsHoldEveryKey) {
  const SyntheticCache sc = SmallCache(300, 3);
  const F16Cache c = sc.View(300);
  auto ix = BuildQuestIndex(c, 16);
  ASSERT_TRUE(ix.ok());
  const int d = c.head_dim;
  for (int h = 0; h < 2; ++h)
    for (uint32_t t = 0; t < 300; ++t) {
      const uint32_t p = t / 16;
      const float* q = sc.q.data() + size_t(h * 3) * d;
      double bound = 0, dot = 0;
      for (int j = 0; j < d; ++j) {
        const double lo = HalfToFloat(ix->kmin[(size_t(h) * ix->pages + p) * d + j]);
        const double hi = HalfToFloat(ix->kmax[(size_t(h) * ix->pages + p) * d + j]);
        bound += std::max(q[j] * lo, q[j] * hi);
        dot += q[j] * double(HalfToFloat(c.k_row(h, t)[j]));
      }
      ASSERT_GE(bound + 1e-9, dot);
    }
}

TEST(AttentionDecodeTest, SamplerEstimatorIsUnbiasedAtAFixedLevel) {
  const SyntheticCache sc = SmallCache(800, 4);
  const F16Cache c = sc.View(800);
  auto ix = BuildSamplerIndex(c);
  ASSERT_TRUE(ix.ok());
  std::vector<float> exact(sc.q.size()), out(sc.q.size());
  ExactDecode(c, 6, sc.q, exact);
  std::vector<double> mean(out.size(), 0.0);
  std::vector<HeadCertificate> certs;
  const int runs = 400;
  double sampled = 0, single_err = 0;
  for (int r = 0; r < runs; ++r) {
    SamplerOptions so;
    so.seed = 1000 + r;
    so.force_level = 4;  // tau = 1/16: a real sample, far from exact
    ASSERT_TRUE(CertifiedDecode(c, *ix, 6, sc.q, out, so, &certs).ok());
    for (size_t i = 0; i < out.size(); ++i) mean[i] += out[i] / double(runs);
    for (auto& ce : certs) sampled += ce.sampled;
    single_err += RelErr(out, exact) / runs;
  }
  std::vector<float> meanf(mean.begin(), mean.end());
  EXPECT_LT(sampled / runs / 6, 800.0 * 0.8);   // it did skip values
  EXPECT_GT(single_err, 0.0);
  // The average of 400 independent estimates sits ~20x closer than one.
  EXPECT_LT(RelErr(meanf, exact), single_err / 8);
}

TEST(AttentionDecodeTest, SamplerCertificatesHoldAndAreRecorded) {
  const SyntheticCache sc = SmallCache(2000, 5);
  const F16Cache c = sc.View(2000);
  auto ix = BuildSamplerIndex(c);
  ASSERT_TRUE(ix.ok());
  std::vector<float> exact(sc.q.size()), out(sc.q.size());
  ExactDecode(c, 6, sc.q, exact);
  int certified = 0, violated = 0, sampled_heads = 0;
  std::vector<HeadCertificate> certs;
  for (int r = 0; r < 50; ++r) {
    SamplerOptions so;
    so.epsilon = 0.1;
    so.seed = r + 1;
    ASSERT_TRUE(CertifiedDecode(c, *ix, 6, sc.q, out, so, &certs).ok());
    ASSERT_EQ(certs.size(), 6u);
    for (int h = 0; h < 6; ++h) {
      ASSERT_TRUE(certs[h].certified);
      const double err = RelErr(std::span(out).subspan(h * 40, 40), std::span(exact).subspan(h * 40, 40));
      ++certified;
      violated += err > so.epsilon;
      if (certs[h].level >= 0) {
        ++sampled_heads;
        EXPECT_LE(certs[h].bound, so.epsilon + 1e-12);
        EXPECT_LT(certs[h].sampled, 2000u);
      } else {
        EXPECT_LT(err, 1e-5);  // the exact fallback
      }
    }
  }
  EXPECT_EQ(violated, 0) << "of " << certified;
  EXPECT_GT(sampled_heads, 0);
  // A target no level of a short grid reaches falls back to exact.
  SamplerOptions tight;
  tight.epsilon = 1e-6;
  tight.levels = 4;
  ASSERT_TRUE(CertifiedDecode(c, *ix, 6, sc.q, out, tight, &certs).ok());
  for (auto& ce : certs) EXPECT_EQ(ce.level, -1);
  EXPECT_LT(RelErr(out, exact), 1e-5);
}

TEST(AttentionDecodeTest, BadInputsAreRejected) {
  const SyntheticCache sc = SmallCache(100, 6);
  F16Cache c = sc.View(100);
  std::vector<float> out(sc.q.size());
  EXPECT_FALSE(DenseDecode(c, 5, sc.q, out).ok());                               // group does not divide
  EXPECT_FALSE(DenseDecode(c, 6, std::span(sc.q).first(10), out).ok());          // short query
  DecodeOptions o;
  o.threads = 0;
  EXPECT_FALSE(DenseDecode(c, 6, sc.q, out, o).ok());
  auto ix = BuildSamplerIndex(c);
  SamplerOptions so;
  so.epsilon = 0;
  EXPECT_FALSE(CertifiedDecode(c, *ix, 6, sc.q, out, so).ok());
  EXPECT_FALSE(BuildQuestIndex(c, 0).ok());
  c.n_tokens = 0;
  EXPECT_FALSE(DenseDecode(c, 6, sc.q, out).ok());
}

}  // namespace
}  // namespace flatkv::attention
