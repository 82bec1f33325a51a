// StreamCopy: memcpy for bulk copies whose destination is not read again
// soon (a restore's bytes, which the engine consumes later, layer by layer).
// From kStreamCopyMinBytes it writes with non-temporal stores, which skip
// reading each destination line into the cache before overwriting it.
//
// Why: glibc's memcpy switches to non-temporal stores only for a single call
// larger than its threshold (about 3/4 of the shared cache), so one 256 MiB
// memcpy streams while the same bytes copied as 8 MiB stretches (a restore's
// per-layer copies) do not: 5.0 against 10.6 GB/s on one core of this
// machine (docs/benchmarks.md, "DRAM restores and the memcpy baseline").
//
// The scalar path is memcpy; the AVX2 one (stream_copy_avx2.cc: four 4 KiB
// streams at a time, prefetched, as glibc copies past its threshold) is checked
// against it byte for byte (stream_copy_test.cc). Both end with the bytes
// visible to other threads once the caller publishes them (an sfence after
// the streaming stores).
#pragma once

#include <cstddef>

namespace flatkv {

inline constexpr size_t kStreamCopyMinBytes = 256 << 10;

void StreamCopy(void* dst, const void* src, size_t n);

namespace internal {
// The AVX2 path, for every size (StreamCopy picks it from kStreamCopyMinBytes).
void StreamCopyAvx2(void* dst, const void* src, size_t n);
}  // namespace internal

}  // namespace flatkv
