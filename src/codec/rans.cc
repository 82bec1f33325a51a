#include "codec/rans.h"

#include <algorithm>
#include <cstring>

#include "codec/rans_internal.h"
#include "common/cpu.h"

namespace flatkv::codec {

using rans::kLow;
using rans::kScaleBits;
using rans::kTotal;
using rans::Slot;

namespace {

// Normalises counts to frequencies summing to kTotal, each present symbol >= 1.
void Normalise(const uint64_t* count, uint64_t n, uint32_t* freq) {
  uint32_t sum = 0;
  int largest = -1;
  for (int s = 0; s < 256; ++s) {
    freq[s] = 0;
    if (!count[s]) continue;
    freq[s] = std::max<uint32_t>(1, uint32_t(count[s] * kTotal / n));
    sum += freq[s];
    if (largest < 0 || count[s] > count[largest]) largest = s;
  }
  // Fix the total on the largest symbols (never dropping one to zero).
  while (sum != kTotal) {
    if (sum < kTotal) {
      freq[largest] += kTotal - sum;
      sum = kTotal;
    } else {
      int best = -1;
      for (int s = 0; s < 256; ++s)
        if (freq[s] > 1 && (best < 0 || freq[s] > freq[best])) best = s;
      const uint32_t take = std::min(sum - kTotal, freq[best] - 1);
      freq[best] -= take;
      sum -= take;
    }
  }
}

}  // namespace

size_t RansBound(size_t n, int states) { return n == 0 ? 0 : 32 + 2 * 256 + 4 * size_t(states) + 2 * n + 16; }

size_t RansEncode(const uint8_t* in, size_t n, uint8_t* out, size_t cap, uint8_t* scratch, int states) {
  if (n == 0 || (states != kRansNarrow && states != kRansWide)) return 0;
  const int kStates = states;
  uint64_t count[256] = {};
  for (size_t i = 0; i < n; ++i) ++count[in[i]];
  uint32_t freq[256], cum[257];
  Normalise(count, n, freq);
  cum[0] = 0;
  for (int s = 0; s < 256; ++s) cum[s + 1] = cum[s] + freq[s];
  // Encode backwards into the end of scratch.
  const size_t scratch_size = RansBound(n, states);
  uint8_t* end = scratch + scratch_size;
  uint8_t* p = end;
  uint32_t state[kRansWide];
  std::fill_n(state, kStates, kLow);
  for (size_t i = n; i-- > 0;) {
    const uint8_t s = in[i];
    uint32_t& x = state[i % kStates];
    const uint32_t f = freq[s];
    const uint64_t x_max = (uint64_t(kLow >> kScaleBits) << 16) * f;
    if (x >= x_max) {
      if (p - scratch < 2) return 0;
      p -= 2;
      const uint16_t word = uint16_t(x);
      std::memcpy(p, &word, 2);
      x >>= 16;
    }
    x = ((x / f) << kScaleBits) + (x % f) + cum[s];
  }
  // Table: a 256-bit presence map, then each present symbol's frequency as
  // one byte (< 128) or two (0x80 | low 7 bits, then the rest).
  uint8_t table[32 + 2 * 256];
  size_t tlen = 32;
  std::memset(table, 0, 32);
  for (int s = 0; s < 256; ++s) {
    if (!freq[s]) continue;
    table[s >> 3] |= uint8_t(1u << (s & 7));
    if (freq[s] < 128) {
      table[tlen++] = uint8_t(freq[s]);
    } else {
      table[tlen++] = uint8_t(0x80 | (freq[s] & 0x7F));
      table[tlen++] = uint8_t(freq[s] >> 7);
    }
  }
  const size_t stream = size_t(end - p);
  const size_t total = tlen + 4 * kStates + stream;
  if (total > cap) return 0;
  uint8_t* o = out;
  std::memcpy(o, table, tlen);
  o += tlen;
  std::memcpy(o, state, 4 * kStates);
  o += 4 * kStates;
  std::memcpy(o, p, stream);
  return total;
}

namespace rans {

const uint8_t* ParseTable(const uint8_t* in, size_t len, Slot* table) {
  if (len < 32) return nullptr;
  uint32_t sum = 0;
  const uint8_t* p = in + 32;
  const uint8_t* end = in + len;
  for (int s = 0; s < 256; ++s) {
    if (!(in[s >> 3] >> (s & 7) & 1)) continue;
    if (p == end) return nullptr;
    uint32_t f = *p++;
    if (f & 0x80) {
      if (p == end) return nullptr;
      f = (f & 0x7F) | (uint32_t(*p++) << 7);
    }
    if (f == 0 || sum + f > kTotal) return nullptr;
    for (uint32_t k = 0; k < f; ++k) table[sum + k] = {uint16_t(f), uint16_t(k), uint8_t(s)};
    sum += f;
  }
  return sum == kTotal ? p : nullptr;
}

bool DecodeTail(const Slot* table, uint32_t* x, int states, size_t i, const uint8_t* p, const uint8_t* end,
                uint8_t* out, size_t n) {
  bool ok = true;
  auto step = [&](uint32_t& st, uint8_t* o) {
    const Slot e = table[st & (kTotal - 1)];
    *o = e.sym;
    st = uint32_t(e.freq) * (st >> kScaleBits) + e.bias;
    // At most one 16-bit read per symbol; branch-free on the hot path.
    const bool need = st < kLow;
    uint16_t word = 0;
    if (end - p >= 2) {
      std::memcpy(&word, p, 2);
    } else if (need) {
      ok = false;
    }
    st = need ? (st << 16) | word : st;
    p += need && ok ? 2 : 0;
  };
  for (; i < n; ++i) step(x[i % size_t(states)], out + i);
  // The encoder started from kLow in every state: anything else is damage.
  for (int k = 0; k < states; ++k) ok = ok && x[k] == kLow;
  return ok && p == end;
}

}  // namespace rans

bool RansDecodeScalar(const uint8_t* in, size_t len, uint8_t* out, size_t n, int states) {
  if (states != kRansNarrow && states != kRansWide) return false;
  if (n == 0) return len == 0;
  Slot table[kTotal];
  const uint8_t* p = rans::ParseTable(in, len, table);
  const uint8_t* end = in + len;
  if (p == nullptr || size_t(end - p) < 4 * size_t(states)) return false;
  uint32_t x[kRansWide];
  std::memcpy(x, p, 4 * size_t(states));
  p += 4 * size_t(states);
  for (int k = 0; k < states; ++k)
    if (x[k] < kLow) return false;
  // Fast loop: eight symbols read at most 16 bytes, so no bounds checks.
  auto fast = [&](uint32_t& st, uint8_t* o) {
    const Slot e = table[st & (kTotal - 1)];
    *o = e.sym;
    st = uint32_t(e.freq) * (st >> kScaleBits) + e.bias;
    // Arithmetic rather than a branch: whether a state needs a word is
    // close to a coin flip, which a branch predictor cannot learn.
    const uint32_t need = st < kLow;
    uint16_t word;
    std::memcpy(&word, p, 2);
    st = (st << (need * 16)) | (uint32_t(word) & (0u - need));
    p += need * 2;
  };
  size_t i = 0;
  for (; i + size_t(states) <= n && end - p >= 2 * states; i += size_t(states)) {
    for (int g = 0; g < states; g += 8) {
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) fast(x[g + k], out + i + size_t(g + k));
    }
  }
  return rans::DecodeTail(table, x, states, i, p, end, out, n);
}

bool RansDecode(const uint8_t* in, size_t len, uint8_t* out, size_t n, int states) {
  static const bool avx2 = DetectedSimd() >= SimdLevel::kAvx2;
  if (states == kRansWide && avx2) return rans::DecodeWideAvx2(in, len, out, n);
  return RansDecodeScalar(in, len, out, n, states);
}

}  // namespace flatkv::codec
