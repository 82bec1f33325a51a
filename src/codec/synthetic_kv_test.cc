#include "codec/synthetic_kv.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "codec/dtype.h"

namespace flatkv::codec {
namespace {

SliceLayout Llama(uint32_t tokens, DType dt, uint32_t first = 0) {
  SliceLayout l;
  l.shape = KvShape::Mha(32, 8, 128, dt);
  l.tokens = tokens;
  l.first_position = first;
  return l;
}

std::vector<float> AsFloats(const SliceLayout& l, const std::vector<std::byte>& b) {
  std::vector<float> f(l.Elements());
  ToFloat(l.shape.dtype, b.data(), f.data(), f.size());
  return f;
}

TEST(SyntheticKv, DeterministicAndContinuousAcrossSlices) {
  const SliceLayout whole = Llama(32, DType::kF32, 100);
  std::vector<std::byte> a(whole.Bytes()), b(whole.Bytes());
  FillSyntheticKv(whole, 7, a);
  FillSyntheticKv(whole, 7, b);
  EXPECT_EQ(a, b);
  FillSyntheticKv(whole, 8, b);
  EXPECT_NE(a, b);
  // The second half of the 32-token slice equals a 16-token slice at 116.
  const SliceLayout half = Llama(16, DType::kF32, 116);
  std::vector<std::byte> c(half.Bytes());
  FillSyntheticKv(half, 7, c);
  const size_t row = whole.shape.kv_heads * whole.shape.head_dim * 4;
  EXPECT_EQ(0, std::memcmp(c.data(), a.data() + 16 * row, 16 * row));             // K
  EXPECT_EQ(0, std::memcmp(c.data() + 16 * row, a.data() + 48 * row, 16 * row));  // V
}

TEST(SyntheticKv, KeysHaveOutliersAndCorrelatedNeighbours) {
  const SliceLayout l = Llama(64, DType::kF32);
  std::vector<std::byte> b(l.Bytes());
  FillSyntheticKv(l, 1, b);
  const auto f = AsFloats(l, b);
  const size_t kv = 8 * 128;
  double sum_sq = 0, max_abs = 0, diff_sq = 0;
  for (size_t t = 0; t < 64; ++t)
    for (size_t i = 0; i < kv; ++i) {
      const float x = f[t * kv + i];
      sum_sq += x * x;
      max_abs = std::max(max_abs, double(std::fabs(x)));
      if (t > 0) diff_sq += (x - f[(t - 1) * kv + i]) * (x - f[(t - 1) * kv + i]);
    }
  const double rms = std::sqrt(sum_sq / (64 * kv));
  EXPECT_GT(max_abs, 6 * rms);                 // outlier channels
  EXPECT_LT(diff_sq / 63, 0.5 * sum_sq / 64);  // neighbours closer than random
}

TEST(SyntheticKv, DtypesAndMlaAndQueries) {
  for (DType dt : {DType::kF16, DType::kBF16}) {
    const SliceLayout l = Llama(5, dt);
    std::vector<std::byte> b(l.Bytes());
    FillSyntheticKv(l, 3, b);
    for (float x : AsFloats(l, b)) EXPECT_TRUE(std::isfinite(x));
  }
  SliceLayout m;
  m.shape = KvShape::Mla(61, 512, 64, DType::kBF16);
  m.tokens = 3;
  std::vector<std::byte> b(m.Bytes());
  FillSyntheticKv(m, 3, b);
  std::vector<float> q(3 * 4 * 576);
  FillSyntheticQueries(m, 4, 3, q);
  for (float x : q) EXPECT_TRUE(std::isfinite(x));
  const SliceLayout l = Llama(4, DType::kF32);
  std::vector<float> q2(4 * 32 * 128);
  FillSyntheticQueries(l, 32, 3, q2);
  for (float x : q2) EXPECT_TRUE(std::isfinite(x));
}

TEST(CodecDtype, Avx2MatchesScalarOnAwkwardSizes) {
  if (DetectedSimd() < SimdLevel::kAvx2) GTEST_SKIP() << "no AVX2";
  uint64_t s = 12345;
  for (size_t n : {0, 1, 7, 8, 9, 31, 33, 257}) {
    std::vector<float> in(n);
    for (size_t i = 0; i < n; ++i) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      const uint32_t u = uint32_t(s >> 32);
      in[i] = (i % 5 == 0) ? BitsToFloat(u) : float(int32_t(u)) * 1e-9f;  // includes inf/nan/subnormals
    }
    for (DType dt : {DType::kF16, DType::kBF16, DType::kF32}) {
      std::vector<std::byte> a(n * 4 + 1), b(n * 4 + 1);
      scalar::FromFloat(dt, in.data(), a.data(), n);
      avx2::FromFloat(dt, in.data(), b.data(), n);
      ASSERT_EQ(a, b) << DTypeName(dt) << " n=" << n;
      std::vector<float> fa(n), fb(n);
      scalar::ToFloat(dt, a.data(), fa.data(), n);
      avx2::ToFloat(dt, a.data(), fb.data(), n);
      ASSERT_TRUE(n == 0 || std::memcmp(fa.data(), fb.data(), 4 * n) == 0) << DTypeName(dt) << " n=" << n;
    }
  }
}

}  // namespace
}  // namespace flatkv::codec
