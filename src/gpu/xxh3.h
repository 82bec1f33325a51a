// XXH3-64 (seed 0, the default secret): the block checksum of
// common/checksum.h, written once for the host and the device. The CUDA
// checksum kernel (gpu/cuda/device_ops.cu) compiles it with nvcc; the CPU
// test (gpu/xxh3_test.cc) checks it against BlockChecksum (libxxhash) at
// every length class, so the kernel's hash is the one the store wrote.
// Follows xxHash 0.8's scalar code (xxhash.h: XXH3_len_*_64b,
// XXH3_hashLong_64b_internal with the scalar accumulate and scramble).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/hd.h"


namespace flatkv::gpu::xxh3 {

// XXH3_kSecret, xxhash.h.
#define FLATKV_XXH3_SECRET                                                                                            \
  {0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c, 0xde, 0xd4, 0x6d, \
   0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, \
   0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21, 0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, \
   0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, \
   0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, \
   0xd8, 0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51, \
   0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83, 0x34, \
   0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb, 0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, \
   0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, \
   0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, \
   0x40, 0x7e}
inline constexpr size_t kSecretBytes = 192;
inline constexpr uint8_t kSecret[kSecretBytes] = FLATKV_XXH3_SECRET;

inline constexpr uint64_t kP32_1 = 0x9E3779B1U, kP32_2 = 0x85EBCA77U, kP32_3 = 0xC2B2AE3DU;
inline constexpr uint64_t kP64_1 = 0x9E3779B185EBCA87ULL, kP64_2 = 0xC2B2AE3D27D4EB4FULL,
                          kP64_3 = 0x165667B19E3779F9ULL, kP64_4 = 0x85EBCA77C2B2AE63ULL,
                          kP64_5 = 0x27D4EB2F165667C5ULL;

// Little-endian loads (x86 and NVIDIA GPUs); aligned words in one load.
FLATKV_HD inline uint64_t Read64(const uint8_t* p) {
  if ((reinterpret_cast<uintptr_t>(p) & 7) == 0) return *reinterpret_cast<const uint64_t*>(p);
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
FLATKV_HD inline uint32_t Read32(const uint8_t* p) {
  if ((reinterpret_cast<uintptr_t>(p) & 3) == 0) return *reinterpret_cast<const uint32_t*>(p);
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
FLATKV_HD inline uint64_t Rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
FLATKV_HD inline uint64_t Swap64(uint64_t x) {
  uint64_t y = 0;
  for (int i = 0; i < 8; ++i) y = (y << 8) | ((x >> (8 * i)) & 0xff);
  return y;
}
FLATKV_HD inline uint64_t Mul128Fold64(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return (a * b) ^ __umul64hi(a, b);
#else
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(p) ^ static_cast<uint64_t>(p >> 64);
#endif
}
FLATKV_HD inline uint64_t Avalanche(uint64_t h) {
  h ^= h >> 37;
  h *= 0x165667919E3779F9ULL;
  return h ^ (h >> 32);
}
FLATKV_HD inline uint64_t Xxh64Avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= kP64_2;
  h ^= h >> 29;
  h *= kP64_3;
  return h ^ (h >> 32);
}
FLATKV_HD inline uint64_t Rrmxmx(uint64_t h, uint64_t len) {
  h ^= Rotl64(h, 49) ^ Rotl64(h, 24);
  h *= 0x9FB21C651E98DF25ULL;
  h ^= (h >> 35) + len;
  h *= 0x9FB21C651E98DF25ULL;
  return h ^ (h >> 28);
}
FLATKV_HD inline uint64_t Mix16(const uint8_t* in, const uint8_t* s) {
  return Mul128Fold64(Read64(in) ^ Read64(s), Read64(in + 8) ^ Read64(s + 8));
}
FLATKV_HD inline void Accumulate512(uint64_t* acc, const uint8_t* in, const uint8_t* s) {
  for (int i = 0; i < 8; ++i) {
    const uint64_t v = Read64(in + 8 * i);
    const uint64_t k = v ^ Read64(s + 8 * i);
    acc[i ^ 1] += v;
    acc[i] += (k & 0xFFFFFFFFu) * (k >> 32);
  }
}
FLATKV_HD inline void Scramble(uint64_t* acc, const uint8_t* s) {
  for (int i = 0; i < 8; ++i) {
    uint64_t a = acc[i];
    a ^= a >> 47;
    a ^= Read64(s + 8 * i);
    acc[i] = a * kP32_1;
  }
}

// XXH3_64bits(p, len) with `secret` the default secret (kSecret, or its
// copy in device memory).
FLATKV_HD inline uint64_t Hash64(const uint8_t* p, size_t len, const uint8_t* secret) {
  if (len <= 16) {
    if (len > 8) {
      const uint64_t lo = Read64(p) ^ (Read64(secret + 24) ^ Read64(secret + 32));
      const uint64_t hi = Read64(p + len - 8) ^ (Read64(secret + 40) ^ Read64(secret + 48));
      return Avalanche(len + Swap64(lo) + hi + Mul128Fold64(lo, hi));
    }
    if (len >= 4) {
      const uint64_t in64 = Read32(p + len - 4) + (uint64_t{Read32(p)} << 32);
      return Rrmxmx(in64 ^ (Read64(secret + 8) ^ Read64(secret + 16)), len);
    }
    if (len > 0) {
      const uint32_t combined = uint32_t(p[0]) << 16 | uint32_t(p[len >> 1]) << 24 | uint32_t(p[len - 1]) |
                                uint32_t(len) << 8;
      return Xxh64Avalanche(uint64_t{combined} ^ (uint64_t{Read32(secret)} ^ Read32(secret + 4)));
    }
    return Xxh64Avalanche(Read64(secret + 56) ^ Read64(secret + 64));
  }
  if (len <= 128) {
    uint64_t acc = len * kP64_1;
    if (len > 32) {
      if (len > 64) {
        if (len > 96) {
          acc += Mix16(p + 48, secret + 96);
          acc += Mix16(p + len - 64, secret + 112);
        }
        acc += Mix16(p + 32, secret + 64);
        acc += Mix16(p + len - 48, secret + 80);
      }
      acc += Mix16(p + 16, secret + 32);
      acc += Mix16(p + len - 32, secret + 48);
    }
    acc += Mix16(p, secret);
    acc += Mix16(p + len - 16, secret + 16);
    return Avalanche(acc);
  }
  if (len <= 240) {
    uint64_t acc = len * kP64_1;
    const int rounds = static_cast<int>(len) / 16;
    for (int i = 0; i < 8; ++i) acc += Mix16(p + 16 * i, secret + 16 * i);
    acc = Avalanche(acc);
    for (int i = 8; i < rounds; ++i) acc += Mix16(p + 16 * i, secret + 16 * (i - 8) + 3);
    acc += Mix16(p + len - 16, secret + 136 - 17);
    return Avalanche(acc);
  }
  uint64_t acc[8] = {kP32_3, kP64_1, kP64_2, kP64_3, kP64_4, kP32_2, kP64_5, kP32_1};
  constexpr size_t kStripesPerBlock = (kSecretBytes - 64) / 8;  // 16
  constexpr size_t kBlockLen = 64 * kStripesPerBlock;           // 1024
  const size_t blocks = (len - 1) / kBlockLen;
  for (size_t n = 0; n < blocks; ++n) {
    for (size_t s = 0; s < kStripesPerBlock; ++s) Accumulate512(acc, p + n * kBlockLen + s * 64, secret + s * 8);
    Scramble(acc, secret + kSecretBytes - 64);
  }
  const size_t stripes = ((len - 1) - kBlockLen * blocks) / 64;
  for (size_t s = 0; s < stripes; ++s) Accumulate512(acc, p + blocks * kBlockLen + s * 64, secret + s * 8);
  Accumulate512(acc, p + len - 64, secret + kSecretBytes - 64 - 7);
  uint64_t result = len * kP64_1;
  for (int i = 0; i < 4; ++i)
    result += Mul128Fold64(acc[2 * i] ^ Read64(secret + 11 + 16 * i), acc[2 * i + 1] ^ Read64(secret + 11 + 16 * i + 8));
  return Avalanche(result);
}

}  // namespace flatkv::gpu::xxh3
