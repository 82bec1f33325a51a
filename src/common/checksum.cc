#include "common/checksum.h"

#include <xxhash.h>

#include "common/cpu.h"

namespace flatkv {

uint64_t BlockChecksum(const void* data, size_t len) {
  static const bool avx2 = DetectedSimd() >= SimdLevel::kAvx2;
  return avx2 ? internal::BlockChecksumAvx2(data, len) : XXH3_64bits(data, len);
}

uint32_t RecordChecksum(const void* data, size_t len) {
  return static_cast<uint32_t>(XXH3_64bits_withSeed(data, len, 0x6d616e69666573ull));
}

}  // namespace flatkv
