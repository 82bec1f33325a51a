// The 32-state rANS decoder on AVX2 (rans_internal.h). States g*8 .. g*8+7
// are vector g's lanes; symbol i uses state i % 32, so a round of 32 symbols
// is the four vectors in order, and a vector's renormalisation words are the
// next popcount(need) words of the stream, handed to the lanes that need one
// by a permutation looked up by the need mask (after Giesen's
// rans_word_sse41). Each lane computes exactly the scalar decoder's uint32
// arithmetic, so the output and the verdict equal RansDecodeScalar's.
#include <immintrin.h>

#include <array>
#include <cstring>

#include "codec/rans.h"
#include "codec/rans_internal.h"

namespace flatkv::codec::rans {
namespace {

// For each 8-bit need mask: lane k takes word popcount(mask & ((1 << k) - 1)).
struct WordPermutations {
  alignas(32) std::array<std::array<uint32_t, 8>, 256> lane;
  WordPermutations() {
    for (uint32_t m = 0; m < 256; ++m) {
      uint32_t next = 0;
      for (uint32_t k = 0; k < 8; ++k) lane[m][k] = (m >> k & 1) ? next++ : 0;
    }
  }
};

}  // namespace

bool DecodeWideAvx2(const uint8_t* in, size_t len, uint8_t* out, size_t n) {
  constexpr int kStates = kRansWide;
  if (n == 0) return len == 0;
  static const WordPermutations perm;
  Slot table[kTotal];
  const uint8_t* p = ParseTable(in, len, table);
  const uint8_t* end = in + len;
  if (p == nullptr || size_t(end - p) < 4 * size_t(kStates)) return false;
  alignas(32) uint32_t x[kStates];
  std::memcpy(x, p, sizeof x);
  p += sizeof x;
  for (uint32_t v : x)
    if (v < kLow) return false;
  // sym | bias << 8 | (freq - 1) << 20: one gather per eight lanes.
  alignas(32) uint32_t packed[kTotal];
  for (uint32_t s = 0; s < kTotal; ++s)
    packed[s] = uint32_t(table[s].sym) | uint32_t(table[s].bias) << 8 | uint32_t(table[s].freq - 1) << 20;

  const __m256i slot_mask = _mm256_set1_epi32(int(kTotal - 1)), one = _mm256_set1_epi32(1),
                low_byte = _mm256_set1_epi32(0xFF), zero = _mm256_setzero_si256();
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  __m256i st[4];
  for (int g = 0; g < 4; ++g) st[g] = _mm256_load_si256(reinterpret_cast<const __m256i*>(x + 8 * g));
  size_t i = 0;
  // A round reads at most 32 words (64 bytes), each vector's 16-byte load
  // within them: no bounds checks inside.
  for (; i + kStates <= n && end - p >= 64; i += kStates) {
    __m256i sym[4];
    for (int g = 0; g < 4; ++g) {
      const __m256i e = _mm256_i32gather_epi32(reinterpret_cast<const int*>(packed), _mm256_and_si256(st[g], slot_mask), 4);
      sym[g] = _mm256_and_si256(e, low_byte);
      const __m256i freq = _mm256_add_epi32(_mm256_srli_epi32(e, 20), one);
      const __m256i bias = _mm256_and_si256(_mm256_srli_epi32(e, 8), slot_mask);
      st[g] = _mm256_add_epi32(_mm256_mullo_epi32(freq, _mm256_srli_epi32(st[g], kScaleBits)), bias);
    }
    for (int g = 0; g < 4; ++g) {
      const __m256i need = _mm256_cmpeq_epi32(_mm256_srli_epi32(st[g], 16), zero);
      const uint32_t mask = uint32_t(_mm256_movemask_ps(_mm256_castsi256_ps(need)));
      const __m256i words = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      const __m256i mine = _mm256_permutevar8x32_epi32(
          words, _mm256_load_si256(reinterpret_cast<const __m256i*>(perm.lane[mask].data())));
      st[g] = _mm256_blendv_epi8(st[g], _mm256_or_si256(_mm256_slli_epi32(st[g], 16), mine), need);
      p += 2 * __builtin_popcount(mask);
    }
    // The low bytes of the four vectors, in symbol order.
    const __m256i ab = _mm256_packus_epi32(sym[0], sym[1]), cd = _mm256_packus_epi32(sym[2], sym[3]);
    const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, cd), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), bytes);
  }
  for (int g = 0; g < 4; ++g) _mm256_store_si256(reinterpret_cast<__m256i*>(x + 8 * g), st[g]);
  return DecodeTail(table, x, kStates, i, p, end, out, n);
}

}  // namespace flatkv::codec::rans
