// BlockChecksum's AVX2 path: the same XXH3-64, from xxhash.h inlined here
// and compiled with -mavx2 (CMakeLists.txt: *_avx2.cc), where Debian's
// libxxhash is built for SSE2 only. XXH3's vector widths compute the same
// value (checksum_test.cc checks it against the library's); on bytes just
// read from a device, the case of every restore, it checks 9 GB/s against
// SSE2's 6 on one core of this machine.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/checksum.h"

namespace flatkv::internal {

uint64_t BlockChecksumAvx2(const void* data, size_t len) { return XXH3_64bits(data, len); }

}  // namespace flatkv::internal
