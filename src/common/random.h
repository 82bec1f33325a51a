// SplitMix64: the one seeding/mixing function the sampler, the synthetic
// data generators and the certified sampler share (Steele, Lea and Flood,
// "Fast splittable pseudorandom number generators", OOPSLA 2014).
#pragma once

#include <cstdint>

namespace flatkv {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace flatkv
