#include "common/stream_copy.h"

#include <cstring>

#include "common/cpu.h"

namespace flatkv {

void StreamCopy(void* dst, const void* src, size_t n) {
  static const bool avx2 = DetectedSimd() >= SimdLevel::kAvx2;
  if (avx2 && n >= kStreamCopyMinBytes) {
    internal::StreamCopyAvx2(dst, src, n);
  } else {
    std::memcpy(dst, src, n);
  }
}

}  // namespace flatkv
