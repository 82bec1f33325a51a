// Which SIMD instruction sets this CPU (and OS) supports, for choosing a
// kernel at run time. Fast paths live in *_avx2.cc / *_avx512.cc files
// (compiled with those flags, CMakeLists.txt); the scalar kernel is the
// reference they are tested against.
//
// FLATKV_SIMD=scalar|avx2|avx512 in the environment caps the level (tests
// and benchmarks use it to compare paths on one machine).
#pragma once

#include <string_view>

namespace flatkv {

enum class SimdLevel : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// The best level the CPU supports, capped by FLATKV_SIMD. Computed once.
SimdLevel DetectedSimd();
std::string_view SimdName(SimdLevel level);

}  // namespace flatkv
