// An order-0 rANS entropy coder for byte streams (after Duda, and Giesen's
// ryg_rans): 32-bit states renormalised 16 bits at a time (at most one
// read per symbol, so the decoder needs no data-dependent loop), eight states
// interleaved (symbol i uses state i % 8) so the decoder's dependency
// chains overlap, probabilities quantized to 12 bits.
//
// Stream: a 32-byte bitmap of the symbols present; for each present symbol
// in order its frequency, one byte when < 128, else two (0x80 | f & 0x7F,
// then f >> 7), frequencies summing to 4096; eight u32 final states; the
// renormalisation words (u16). An empty input encodes to zero bytes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flatkv::codec {

// Bytes RansEncode may write for n input bytes (its worst case).
size_t RansBound(size_t n);
// Encodes in[0, n) into out (capacity cap >= RansBound(n) is always
// enough); returns the bytes written. `scratch` holds RansBound(n) bytes.
size_t RansEncode(const uint8_t* in, size_t n, uint8_t* out, size_t cap, uint8_t* scratch);
// Decodes exactly n bytes from in[0, len); false when the stream is
// malformed or truncated (never reads or writes out of bounds).
bool RansDecode(const uint8_t* in, size_t len, uint8_t* out, size_t n);

}  // namespace flatkv::codec
