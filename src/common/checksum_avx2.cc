// BlockChecksum's AVX2 path: the same XXH3-64, from xxhash.h inlined here
// and compiled with -mavx2 (CMakeLists.txt: *_avx2.cc), where Debian's
// libxxhash is built for SSE2 only. XXH3's vector widths compute the same
// value (checksum_test.cc checks it against the library's). On 64 KiB
// slices not in the cache, the case of every restore, it checks 6.6 GB/s
// against SSE2's 4.8 on one core of this machine, and 41.7 against 16.8 in
// the cache (flatkv_micro BM_ChecksumColdSlices, BM_BlockChecksum).
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/checksum.h"

namespace flatkv::internal {

uint64_t BlockChecksumAvx2(const void* data, size_t len) { return XXH3_64bits(data, len); }

}  // namespace flatkv::internal
