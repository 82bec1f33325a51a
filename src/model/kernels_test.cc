// Every compiled fast-path kernel (kernels.h) against the scalar reference,
// bit for bit, over shapes that exercise every tail: inputs not a multiple
// of 8, odd token counts (the AVX-512 matmul's token pairs), row ranges that
// are not multiples of the row blocks, key counts around the 8-key batches
// and the cache's block boundaries, and head sizes 8, 12, 20, 64.
#include "model/kernels.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "model/model.h"

namespace flatkv::model {
namespace {

std::vector<const Kernels*> FastKernels() {
  std::vector<const Kernels*> out;
  for (SimdLevel level : {SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (int(level) > int(DetectedSimd())) continue;
    const Kernels& k = KernelsFor(level);
    if (k.level == level) out.push_back(&k);
  }
  return out;
}

// Values over many binades, with zeros of both signs, subnormals and
// (when `specials`) infinities.
std::vector<float> Values(size_t n, uint32_t seed, bool specials) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-12, 12), pick(0, 63);
  std::vector<float> v(n);
  for (auto& f : v) {
    f = std::ldexp(mant(rng), ex(rng));
    const int p = pick(rng);
    if (p == 0) f = 0.0f;
    if (p == 1) f = -0.0f;
    if (p == 2) f = std::numeric_limits<float>::denorm_min() * 3;
    if (specials && p == 3) f = std::numeric_limits<float>::infinity();
    if (specials && p == 4) f = -std::numeric_limits<float>::infinity();
  }
  return v;
}

::testing::AssertionResult SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i]))
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs reference " << b[i];
  return ::testing::AssertionSuccess();
}

TEST(KernelsTest, DispatchNamesItsLevel) {
  EXPECT_EQ(KernelsFor(SimdLevel::kScalar).level, SimdLevel::kScalar);
  EXPECT_LE(int(DefaultKernels().level), int(DetectedSimd()));
}

TEST(KernelsTest, MatMulRowsMatchesScalarBitForBit) {
  const std::vector<const Kernels*> fast = FastKernels();
  if (fast.empty()) GTEST_SKIP() << "no fast kernels on this CPU (DetectedSimd() = " << SimdName(DetectedSimd()) << ")";
  const MatMulRowsFn ref = internal::ScalarKernels().matmul_rows;
  uint32_t seed = 1;
  int cases = 0;
  for (int in : {1, 3, 7, 8, 9, 15, 16, 17, 31, 64, 172, 576}) {
    for (int n : {1, 2, 3, 4, 5, 7, 9, 70}) {
      for (int out : {1, 2, 5, 7, 13, 25}) {
        const bool specials = (seed % 5) == 0;
        const std::vector<float> x = Values(size_t(n) * in, seed++, specials), w = Values(size_t(out) * in, seed++, specials);
        // The whole row range and a partial one (as a thread's share).
        for (auto [r0, r1] : {std::pair{0, out}, std::pair{out / 3, out - out / 4}}) {
          if (r0 >= r1) continue;
          std::vector<float> want(size_t(n) * out, 42.0f);
          ref(x.data(), w.data(), n, in, out, r0, r1, want.data());
          for (const Kernels* k : fast) {
            std::vector<float> got(size_t(n) * out, 42.0f);  // rows outside [r0, r1) stay 42
            k->matmul_rows(x.data(), w.data(), n, in, out, r0, r1, got.data());
            EXPECT_TRUE(SameBits(got, want)) << SimdName(k->level) << " n=" << n << " in=" << in << " out=" << out
                                             << " rows " << r0 << ".." << r1;
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 500);
}

TEST(KernelsTest, AttendMatchesScalarBitForBit) {
  const std::vector<const Kernels*> fast = FastKernels();
  if (fast.empty()) GTEST_SKIP() << "no fast kernels on this CPU (DetectedSimd() = " << SimdName(DetectedSimd()) << ")";
  const AttendFn ref = internal::ScalarKernels().attend;
  uint32_t seed = 100;
  for (int hs : {8, 12, 20, 64}) {
    for (int group : {1, 3}) {
      for (uint32_t bt : {16u, 64u}) {
        Config c;
        c.n_kv_heads = 2;
        c.n_heads = 2 * group;
        c.dim = c.n_heads * hs;
        c.hidden_dim = 8;
        c.n_layers = 2;
        c.vocab_size = 8;
        c.seq_len = 160;
        KvCache cache(c, bt, 160);
        const int kv_dim = c.kv_dim();
        for (int l = 0; l < 2; ++l) {
          for (uint32_t s = 0; s < 160; ++s) {
            // Scores of a few units keep the softmax away from one-hot.
            const std::vector<float> k = Values(kv_dim, seed++, false), v = Values(kv_dim, seed++, false);
            for (int i = 0; i < kv_dim; ++i) {
              cache.k(l, s)[i] = std::clamp(k[i], -2.0f, 2.0f);
              cache.v(l, s)[i] = v[i];
            }
          }
        }
        const float sqrt_hs = std::sqrt(static_cast<float>(hs));
        // Query blocks: one position (decode), contiguous runs around the
        // 8-key batches and page boundaries, and gapped positions (LayerAt).
        const std::vector<std::vector<uint32_t>> blocks = {
            {0}, {1}, {7}, {8}, {9}, {15}, {16}, {17}, {63}, {64}, {65}, {159},
            {0, 1, 2}, {14, 15, 16, 17, 18, 19, 20, 21}, {56, 57, 58, 59, 60, 61, 62, 63, 64, 65}, {5, 9, 40, 130}};
        for (const auto& pos : blocks) {
          const int nt = static_cast<int>(pos.size());
          for (int kvh = 0; kvh < 2; ++kvh) {
            // Queries of nt tokens, rows c.dim apart as in the transformer.
            std::vector<float> q = Values(size_t(nt) * c.dim, seed++, false);
            for (auto& f : q) f = std::clamp(f, -2.0f, 2.0f);
            const size_t scratch = size_t(nt) * group * (pos.back() + 1);
            std::vector<float> att(scratch), want(size_t(nt) * c.dim, 42.0f);
            const int off = kvh * group * hs;
            ref(q.data() + off, c.dim, pos.data(), nt, group, hs, cache, 1, kvh * hs, sqrt_hs, att.data(),
                want.data() + off);
            for (const Kernels* k : fast) {
              std::vector<float> got(size_t(nt) * c.dim, 42.0f), att2(scratch, 42.0f);
              k->attend(q.data() + off, c.dim, pos.data(), nt, group, hs, cache, 1, kvh * hs, sqrt_hs, att2.data(),
                        got.data() + off);
              EXPECT_TRUE(SameBits(got, want)) << SimdName(k->level) << " hs=" << hs << " group=" << group
                                               << " block_tokens=" << bt << " positions " << pos.front() << ".."
                                               << pos.back() << " (" << nt << ") kv head " << kvh;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace flatkv::model
