#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/stream_copy.h"

namespace flatkv::internal {
namespace {

// 128 bytes: four unaligned loads, four streaming stores (d 32-byte aligned).
inline void Copy128(std::byte* d, const std::byte* s) {
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32));
  const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 64));
  const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 96));
  _mm256_stream_si256(reinterpret_cast<__m256i*>(d), a);
  _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 32), b);
  _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 64), c);
  _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 96), e);
}

constexpr size_t kPage = 4096, kStreams = 4;

}  // namespace

void StreamCopyAvx2(void* dst, const void* src, size_t n) {
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  // Up to the destination's next 32-byte boundary with memcpy (streaming
  // stores need aligned destinations).
  const size_t head = std::min(n, size_t((32 - reinterpret_cast<uintptr_t>(d) % 32) % 32));
  std::memcpy(d, s, head);
  size_t i = head;
  // Then 16 KiB at a time as four 4 KiB streams, 128 bytes of each in turn,
  // each prefetched two steps ahead: glibc's large_memcpy_4x shape. One
  // sequential stream leaves the source's reads to the hardware prefetcher,
  // which restarts at every page and every 256 KiB piece of a restore; four
  // keep more reads in flight. On one core copying a 1 GiB restore's 256 KiB
  // pieces: 0.55x memcpy one stream, 0.81x with a prefetch 2 KiB ahead, 0.87x
  // four streams (docs/benchmarks.md, "Four streams a copy").
  for (; i + kStreams * kPage <= n; i += kStreams * kPage) {
    for (size_t o = 0; o < kPage; o += 128) {
      for (size_t p = 0; p < kStreams; ++p) {
        _mm_prefetch(reinterpret_cast<const char*>(s + i + p * kPage + o + 256), _MM_HINT_T0);
        Copy128(d + i + p * kPage + o, s + i + p * kPage + o);
      }
    }
  }
  for (; i + 128 <= n; i += 128) Copy128(d + i, s + i);
  std::memcpy(d + i, s + i, n - i);
  // Streaming stores are weakly ordered: they are complete before whatever
  // the caller does next to publish the bytes.
  _mm_sfence();
}

}  // namespace flatkv::internal
