// StreamCopy's AVX2 path against memcpy: every alignment of both ends, sizes
// around the 128-byte step, the 16 KiB four-stream step and the threshold.
#include "common/stream_copy.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "common/cpu.h"

namespace flatkv {
namespace {

TEST(StreamCopy, EqualsMemcpyAtEveryAlignmentAndSize) {
  std::mt19937 rng(5);
  std::vector<uint8_t> src(kStreamCopyMinBytes * 2 + 4096);
  for (auto& b : src) b = uint8_t(rng());
  const bool avx2 = DetectedSimd() >= SimdLevel::kAvx2;
  for (size_t n : {size_t{0}, size_t{1}, size_t{31}, size_t{127}, size_t{128}, size_t{129}, size_t{4095}, size_t{16383},
                   size_t{16384}, size_t{16384 + 3 * 128 + 5}, size_t{100000},
                   kStreamCopyMinBytes - 1, kStreamCopyMinBytes, kStreamCopyMinBytes + 77}) {
    for (size_t so : {0, 1, 31, 32, 63}) {
      for (size_t dof : {0, 5, 32, 33}) {
        std::vector<uint8_t> want(n + 128, 0xCC), got(n + 128, 0xCC);
        std::memcpy(want.data() + dof, src.data() + so, n);
        StreamCopy(got.data() + dof, src.data() + so, n);
        ASSERT_EQ(want, got) << "StreamCopy n " << n << " src offset " << so << " dst offset " << dof;
        if (avx2) {
          std::fill(got.begin(), got.end(), 0xCC);
          internal::StreamCopyAvx2(got.data() + dof, src.data() + so, n);
          ASSERT_EQ(want, got) << "StreamCopyAvx2 n " << n << " src offset " << so << " dst offset " << dof;
        }
      }
    }
  }
}

}  // namespace
}  // namespace flatkv
