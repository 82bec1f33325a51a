#include "common/checksum.h"

#include <xxhash.h>

namespace flatkv {

uint64_t BlockChecksum(const void* data, size_t len) { return XXH3_64bits(data, len); }

uint32_t RecordChecksum(const void* data, size_t len) {
  return static_cast<uint32_t>(XXH3_64bits_withSeed(data, len, 0x6d616e69666573ull));
}

}  // namespace flatkv
