// The rANS decoders' shared parts (rans.cc, rans_avx2.cc): the stream's
// constants, its frequency table, and the scalar tail both decoders end with.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flatkv::codec::rans {

inline constexpr uint32_t kScaleBits = 12;
inline constexpr uint32_t kTotal = 1u << kScaleBits;
inline constexpr uint32_t kLow = 1u << 16;  // states live in [2^16, 2^32); renormalised 16 bits at a time

// One entry per slot: the symbol, its frequency and slot - cum.
struct Slot {
  uint16_t freq;
  uint16_t bias;
  uint8_t sym;
};

// Reads the stream's symbol bitmap and frequencies into table[kTotal];
// returns where the final states start, or null when the table is
// malformed or truncated.
const uint8_t* ParseTable(const uint8_t* in, size_t len, Slot* table);

// Decodes symbols i..n-1 from states x (one bounds-checked word read at a
// time) and checks the stream's end: every state back at kLow and every
// word consumed.
bool DecodeTail(const Slot* table, uint32_t* x, int states, size_t i, const uint8_t* p, const uint8_t* end,
                uint8_t* out, size_t n);

// The 32-state decoder on AVX2 (rans_avx2.cc): the same results as
// RansDecodeScalar(..., kRansWide) for every input, malformed ones included.
bool DecodeWideAvx2(const uint8_t* in, size_t len, uint8_t* out, size_t n);

}  // namespace flatkv::codec::rans
