// BlockChecksum's AVX2 path against the library's XXH3-64 (the on-disk
// checksum, docs/format_segment.md): every size around XXH3's stripes and
// blocks, at every alignment.
#include "common/checksum.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <random>
#include <vector>

#include "common/cpu.h"

namespace flatkv {
namespace {

TEST(BlockChecksum, EqualsTheLibrarysXxh3AtEverySizeAndAlignment) {
  std::mt19937 rng(7);
  std::vector<uint8_t> bytes((256 << 10) + 64);
  for (auto& b : bytes) b = uint8_t(rng());
  const bool avx2 = DetectedSimd() >= SimdLevel::kAvx2;
  for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{16}, size_t{17}, size_t{128}, size_t{129}, size_t{240},
                   size_t{241}, size_t{1023}, size_t{1024}, size_t{1025}, size_t{4096}, size_t{65536},
                   size_t{65536 + 77}, size_t{256} << 10}) {
    for (size_t at : {0, 1, 8, 31, 32, 63}) {
      const uint64_t want = XXH3_64bits(bytes.data() + at, n);
      ASSERT_EQ(BlockChecksum(bytes.data() + at, n), want) << "n " << n << " offset " << at;
      if (avx2) {
        ASSERT_EQ(internal::BlockChecksumAvx2(bytes.data() + at, n), want) << "AVX2, n " << n << " offset " << at;
      }
    }
  }
}

}  // namespace
}  // namespace flatkv
