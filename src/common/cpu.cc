#include "common/cpu.h"

#include <cstdlib>
#include <cstring>

namespace flatkv {
namespace {

SimdLevel Detect() {
  SimdLevel level = SimdLevel::kScalar;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    level = SimdLevel::kAvx2;
  if (level == SimdLevel::kAvx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    level = SimdLevel::kAvx512;
#endif
  if (const char* cap = std::getenv("FLATKV_SIMD")) {
    SimdLevel want = level;
    if (!std::strcmp(cap, "scalar")) want = SimdLevel::kScalar;
    else if (!std::strcmp(cap, "avx2")) want = SimdLevel::kAvx2;
    else if (!std::strcmp(cap, "avx512")) want = SimdLevel::kAvx512;
    if (int(want) < int(level)) level = want;
  }
  return level;
}

}  // namespace

SimdLevel DetectedSimd() {
  static const SimdLevel level = Detect();
  return level;
}

std::string_view SimdName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar: return "scalar";
    case SimdLevel::kAvx2: return "avx2";
    case SimdLevel::kAvx512: return "avx512";
  }
  return "?";
}

}  // namespace flatkv
