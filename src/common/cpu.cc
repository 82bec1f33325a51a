#include "common/cpu.h"

#include <cstdlib>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <cstring>

namespace flatkv {
namespace {

SimdLevel Detect() {
  SimdLevel level = SimdLevel::kScalar;
#if defined(__x86_64__)
  __builtin_cpu_init();
  // F16C and FMA from CPUID leaf 1 ECX (bits 29 and 12): clang 14's
  // __builtin_cpu_supports does not know "f16c".
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool leaf1 = __get_cpuid(1, &eax, &ebx, &ecx, &edx);
  const bool f16c_fma = leaf1 && (ecx & (1u << 29)) && (ecx & (1u << 12));
  if (__builtin_cpu_supports("avx2") && f16c_fma) level = SimdLevel::kAvx2;
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
