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
    for (int g : {1, 2, 3, 4, 8})
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
        std::vector<float> w(n), ra(n), rb(n), vn(n);
        for (uint32_t i = 0; i < n; ++i) {
          w[i] = std::exp(-float(i % 9) * 1.7f);
          vn[i] = 1.0f + 0.1f * i;
        }
        s.race_rates(77, 5, n, 0.5f, ra.data());
        v.race_rates(77, 5, n, 0.5f, rb.data());
        for (uint32_t i = 0; i < n; ++i) ASSERT_NEAR(ra[i], rb[i], 1e-5f * ra[i]);
        double sums_a[3] = {}, sums_b[3] = {};
        s.weight_sums(w.data(), vn.data(), n, &sums_a[0], &sums_a[1], &sums_a[2]);
        v.weight_sums(w.data(), vn.data(), n, &sums_b[0], &sums_b[1], &sums_b[2]);
        for (int i = 0; i < 3; ++i) EXPECT_NEAR(sums_a[i], sums_b[i], 1e-5 * sums_a[i]);
        EXPECT_NEAR(s.masked_wvv(w.data(), vn.data(), n, 0.1f), v.masked_wvv(w.data(), vn.data(), n, 0.1f), 1e-5);
        std::vector<uint32_t> ia(n), ib(n);
        const uint32_t ma = s.select(w.data(), ra.data(), n, 0.05f, ia.data());
        const uint32_t mb = v.select(w.data(), ra.data(), n, 0.05f, ib.data());
        ASSERT_EQ(ma, mb);
        ia.resize(ma);
        ib.resize(mb);
        EXPECT_EQ(ia, ib);
        std::vector<float> ga(d, 0.25f), gb(ga);
        s.gather(ia.data(), w.data(), ma, vv.data(), d, ga.data());
        v.gather(ia.data(), w.data(), ma, vv.data(), d, gb.data());
        for (int j = 0; j < d; ++j) ASSERT_NEAR(ga[j], gb[j], 1e-4f * (1 + std::fabs(ga[j])));
      }
}

TEST(AttentionDecodeTest, RaceRatesAreExponentialAndSelectFollowsThem) {
  // E = 1 / r is Exp(1) (where 1/r > cap): its mean is 1 and P(E > 1) = e^-1.
  const uint32_t n = 200000;
  std::vector<float> r(n);
  KernelsFor(DetectedSimd()).race_rates(3, 0, n, 0.0f, r.data());
  double mean = 0, above = 0;
  for (float x : r) {
    mean += 1.0 / x / n;
    above += (1.0 / x > 1.0) / double(n);
  }
  EXPECT_NEAR(mean, 1.0, 0.01);
  EXPECT_NEAR(above, std::exp(-1.0), 0.005);
  // A key of weight w enters at tau with probability 1 - exp(-w / tau).
  std::vector<float> w(n, 0.3f);
  std::vector<uint32_t> idx(n);
  const uint32_t m = KernelsFor(DetectedSimd()).select(w.data(), r.data(), n, 0.5f, idx.data());
  EXPECT_NEAR(m / double(n), 1 - std::exp(-0.6), 0.005);
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
