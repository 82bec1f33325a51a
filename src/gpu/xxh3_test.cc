// gpu/xxh3.h, the checksum the CUDA kernel computes, equals the store's
// BlockChecksum (XXH3-64 from libxxhash) at every length class: short
// (0-16), 17-128, 129-240, long (one partial block, whole 1 KiB blocks,
// odd tails) and a block slice's sizes, from aligned and unaligned starts.
#include "gpu/xxh3.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "common/checksum.h"

namespace flatkv::gpu {
namespace {

TEST(Xxh3Test, EqualsTheStoresBlockChecksumAtEveryLength) {
  std::vector<uint8_t> data((1 << 18) + 64);
  std::mt19937_64 rng(7);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 2100; ++n) lengths.push_back(n);
  for (size_t n : {4095u, 4096u, 4097u, 16384u, 65536u, 65537u, 131071u, 262144u}) lengths.push_back(n);
  for (size_t offset : {0u, 1u, 3u, 8u}) {
    for (size_t n : lengths) {
      const uint8_t* p = data.data() + offset;
      ASSERT_EQ(xxh3::Hash64(p, n, xxh3::kSecret), BlockChecksum(p, n)) << "length " << n << " offset " << offset;
    }
  }
}

}  // namespace
}  // namespace flatkv::gpu
