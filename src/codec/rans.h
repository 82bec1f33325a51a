// An order-0 rANS entropy coder for byte streams (after Duda, and Giesen's
// ryg_rans): 32-bit states renormalised 16 bits at a time (at most one
// read per symbol, so the decoder needs no data-dependent loop), `states`
// states interleaved (symbol i uses state i % states) so the decoder's
// dependency chains overlap, probabilities quantized to 12 bits.
//
// Stream: a 32-byte bitmap of the symbols present; for each present symbol
// in order its frequency, one byte when < 128, else two (0x80 | f & 0x7F,
// then f >> 7), frequencies summing to 4096; `states` u32 final states; the
// renormalisation words (u16), read in symbol order. An empty input encodes
// to zero bytes.
//
// Two widths: 8 states (the first format; a scalar decoder), and 32 states
// (kRansWide), whose decoder keeps them in four 8-lane AVX2 vectors: four
// independent chains of table gathers where eight scalar states wait on one
// shared word pointer. The 32-state stream is the 8-state one with more
// states; its scalar decoder is the reference the vector one is checked
// against (rans_avx2.cc, kernels_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>

namespace flatkv::codec {

inline constexpr int kRansNarrow = 8;
inline constexpr int kRansWide = 32;

// Bytes RansEncode may write for n input bytes (its worst case).
size_t RansBound(size_t n, int states = kRansNarrow);
// Encodes in[0, n) with `states` (kRansNarrow or kRansWide) interleaved
// states into out (capacity cap >= RansBound(n, states) is always enough);
// returns the bytes written. `scratch` holds RansBound(n, states) bytes.
size_t RansEncode(const uint8_t* in, size_t n, uint8_t* out, size_t cap, uint8_t* scratch, int states = kRansNarrow);
// Decodes exactly n bytes from in[0, len), with the fastest decoder this CPU
// has; false when the stream is malformed or truncated (never reads or
// writes out of bounds).
bool RansDecode(const uint8_t* in, size_t len, uint8_t* out, size_t n, int states = kRansNarrow);
// The scalar decoder (the reference for the vector one).
bool RansDecodeScalar(const uint8_t* in, size_t len, uint8_t* out, size_t n, int states);

}  // namespace flatkv::codec
