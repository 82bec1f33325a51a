#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/stream_copy.h"

namespace flatkv::internal {

void StreamCopyAvx2(void* dst, const void* src, size_t n) {
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  // Up to the destination's next 32-byte boundary with memcpy (streaming
  // stores need aligned destinations), then 128 bytes a step, then the tail.
  const size_t head = std::min(n, size_t((32 - reinterpret_cast<uintptr_t>(d) % 32) % 32));
  std::memcpy(d, s, head);
  size_t i = head;
  for (; i + 128 <= n; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 96), e);
  }
  std::memcpy(d + i, s + i, n - i);
  // Streaming stores are weakly ordered: they are complete before whatever
  // the caller does next to publish the bytes.
  _mm_sfence();
}

}  // namespace flatkv::internal
