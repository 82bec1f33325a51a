// Each SIMD kernel against the scalar reference on awkward sizes, and the
// rANS coder.
#include "codec/kernels.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "codec/rans.h"

namespace flatkv::codec {
namespace {

// Bitwise equality of two float arrays (empty ones included).
bool SameBits(const float* a, const float* b, size_t n) { return n == 0 || std::memcmp(a, b, 4 * n) == 0; }

TEST(CodecKernels, Avx2MatchesScalar) {
  const Kernels* fast = Avx2Kernels();
  if (!fast) GTEST_SKIP() << "no AVX2";
  const Kernels& ref = ScalarKernels();
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(-3, 3);
  for (size_t block : {1, 2, 4, 8, 16, 64, 128, 256})
    for (size_t blocks : {1, 3}) {
      const size_t n = block * blocks * (block < 8 ? 8 : 1);
      std::vector<float> x(n), sign(n);
      for (size_t i = 0; i < n; ++i) x[i] = u(rng), sign[i] = (rng() & 1) ? 1.0f : -1.0f;
      for (int inverse = 0; inverse < 2; ++inverse) {
        auto a = x, b = x;
        (inverse ? ref.fwht_sign : ref.sign_fwht)(a.data(), sign.data(), n, block, 0.125f);
        (inverse ? fast->fwht_sign : fast->sign_fwht)(b.data(), sign.data(), n, block, 0.125f);
        ASSERT_TRUE(SameBits(a.data(), b.data(), n)) << "block " << block << " inverse " << inverse;
      }
    }
  for (int bits : {2, 3, 4, 8})
    for (size_t first : {0, 1, 4, 8, 16})
      for (size_t n : {0, 1, 7, 8, 9, 31, 32, 33, 100}) {
        std::vector<uint8_t> packed((first + n) * bits / 8 + 16);
        for (auto& p : packed) p = uint8_t(rng());
        std::vector<float> lo(n), step(n), a(n), b(n);
        for (size_t i = 0; i < n; ++i) lo[i] = u(rng), step[i] = u(rng);
        ref.dequant_scalar(packed.data(), bits, first, n, 0.5f, 0.25f, a.data());
        fast->dequant_scalar(packed.data(), bits, first, n, 0.5f, 0.25f, b.data());
        ASSERT_TRUE(SameBits(a.data(), b.data(), n)) << bits << " " << first << " " << n;
        ref.dequant_vec(packed.data(), bits, first, n, lo.data(), step.data(), a.data());
        fast->dequant_vec(packed.data(), bits, first, n, lo.data(), step.data(), b.data());
        ASSERT_TRUE(SameBits(a.data(), b.data(), n)) << bits << " " << first << " " << n;
      }
}

TEST(CodecKernels, DequantReadsEveryCodeWidth) {
  std::mt19937 rng(5);
  for (const Kernels* k : {&ScalarKernels(), Avx2Kernels()}) {
    if (!k) continue;
    for (int bits = 1; bits <= 8; ++bits) {
      std::vector<uint8_t> codes(50);
      for (auto& c : codes) c = uint8_t(rng() & ((1u << bits) - 1));
      std::vector<uint8_t> packed((50 * bits + 7) / 8);
      PackCodes(codes.data(), 50, bits, packed.data());
      for (size_t first : {0, 3, 8}) {
        std::vector<float> out(50 - first), lo(50, 1.0f), step(50, 2.0f);
        k->dequant_scalar(packed.data(), bits, first, out.size(), 1.0f, 2.0f, out.data());
        for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], 1.0f + 2.0f * codes[first + i]) << bits;
        k->dequant_vec(packed.data(), bits, first, out.size(), lo.data(), step.data(), out.data());
        for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], 1.0f + 2.0f * codes[first + i]) << bits;
      }
    }
  }
}

TEST(CodecKernels, PackUnpackRoundTrip) {
  std::mt19937 rng(1);
  for (int bits = 1; bits <= 8; ++bits) {
    std::vector<uint8_t> codes(77), back(77);
    for (auto& c : codes) c = uint8_t(rng() & ((1u << bits) - 1));
    std::vector<uint8_t> packed((77 * bits + 7) / 8);
    PackCodes(codes.data(), 77, bits, packed.data());
    UnpackCodes(packed.data(), bits, 0, 77, back.data());
    EXPECT_EQ(codes, back) << bits;
    UnpackCodes(packed.data(), bits, 5, 72, back.data());
    EXPECT_TRUE(std::equal(back.begin(), back.begin() + 72, codes.begin() + 5)) << bits;
  }
}

TEST(CodecRans, RoundTripsAndRejectsDamage) {
  std::mt19937 rng(3);
  for (int states : {kRansNarrow, kRansWide}) {
    for (size_t n : {1, 2, 3, 5, 31, 32, 33, 100, 4097, 50000}) {
      for (int kind = 0; kind < 3; ++kind) {
        SCOPED_TRACE(std::to_string(states) + " states, n " + std::to_string(n) + ", kind " + std::to_string(kind));
        std::vector<uint8_t> in(n);
        for (auto& b : in)
          b = kind == 0   ? 7
              : kind == 1 ? uint8_t(rng())
                          : uint8_t(std::min(254.0, std::fabs(std::normal_distribution<>(0, 3)(rng))));
        std::vector<uint8_t> out(RansBound(n, states)), scratch(RansBound(n, states)), back(n), ref(n);
        const size_t len = RansEncode(in.data(), n, out.data(), out.size(), scratch.data(), states);
        ASSERT_GT(len, 0u);
        ASSERT_TRUE(RansDecode(out.data(), len, back.data(), n, states));
        EXPECT_EQ(in, back);
        ASSERT_TRUE(RansDecodeScalar(out.data(), len, ref.data(), n, states));
        EXPECT_EQ(in, ref);
        for (size_t cut = 0; cut < std::min<size_t>(len, 40); ++cut)
          EXPECT_FALSE(RansDecode(out.data(), cut, back.data(), n, states));
        // Damage: the fast decoder gives the scalar reference's verdict and bytes.
        for (int i = 0; i < 50; ++i) {
          auto bad = out;
          bad[rng() % len] ^= uint8_t(1 + rng() % 255);
          std::fill(back.begin(), back.end(), 0);
          std::fill(ref.begin(), ref.end(), 0);
          const bool fast_ok = RansDecode(bad.data(), len, back.data(), n, states);
          EXPECT_EQ(fast_ok, RansDecodeScalar(bad.data(), len, ref.data(), n, states));
          if (fast_ok) {
            EXPECT_EQ(back, ref);
          }
        }
      }
    }
  }
  // A stream's width is not guessed: an 8-state stream read as 32 states fails.
  std::vector<uint8_t> in(5000, 3), out(RansBound(5000)), scratch(RansBound(5000)), back(5000);
  in[17] = 9;
  const size_t len = RansEncode(in.data(), in.size(), out.data(), out.size(), scratch.data(), kRansNarrow);
  EXPECT_FALSE(RansDecode(out.data(), len, back.data(), in.size(), kRansWide));
  EXPECT_EQ(RansEncode(in.data(), in.size(), out.data(), out.size(), scratch.data(), 16), 0u);
}

}  // namespace
}  // namespace flatkv::codec

namespace flatkv::codec {
namespace {

TEST(CodecKernels, PredKernelsAvx2MatchScalar) {
  const Kernels* fast = Avx2Kernels();
  if (!fast) GTEST_SKIP() << "no AVX2";
  const Kernels& ref = ScalarKernels();
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-4, 4);
  for (size_t n : {2, 6, 8, 10, 30, 64, 130}) {
    std::vector<float> prev(n), cs(n), sn(n), a(n), b(n);
    for (size_t i = 0; i < n; ++i) prev[i] = u(rng), cs[i] = u(rng), sn[i] = u(rng);
    prev[n / 2] = std::numeric_limits<float>::infinity();
    prev[n - 1] = std::numeric_limits<float>::quiet_NaN();
    ref.rope_predict(prev.data(), cs.data(), sn.data(), a.data(), n);
    fast->rope_predict(prev.data(), cs.data(), sn.data(), b.data(), n);
    ASSERT_TRUE(SameBits(a.data(), b.data(), n)) << n;
    for (int dt : {1, 2, 3})
      for (int trial = 0; trial < 20; ++trial) {
        std::vector<uint8_t> tok(n);
        for (auto& t : tok) t = uint8_t(1 + rng() % 254);
        if (trial % 2) tok[rng() % n] = uint8_t((rng() & 1) ? 0 : 255);
        std::vector<float> pred(n), oa(n, -7.0f), ob(n, -7.0f);
        for (auto& p : pred) p = u(rng) * (trial % 3 ? 1.0f : 30000.0f);
        size_t da = 0, db = 0;
        // Both run to the first escape; the fast one may stop earlier.
        while (da < n && tok[da] != 0 && tok[da] != 255)
          da += ref.pred_reconstruct(tok.data() + da, pred.data() + da, oa.data() + da, n - da, 0.37f, dt);
        while (db < n && tok[db] != 0 && tok[db] != 255) {
          const size_t got =
              fast->pred_reconstruct(tok.data() + db, pred.data() + db, ob.data() + db, n - db, 0.37f, dt);
          db += got ? got : 1;  // a zero answer must be the scalar's too
          if (!got) ob[db - 1] = oa[db - 1];
        }
        ASSERT_EQ(da, db);
        // Up to the escape; past it the fast path may have written lanes the caller rewrites.
        ASSERT_TRUE(SameBits(oa.data(), ob.data(), da)) << n << " dtype " << dt;
      }
  }
}

}  // namespace
}  // namespace flatkv::codec
