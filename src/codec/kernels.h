// The hot loops the lossy codecs share, as a scalar reference
// (namespace scalar) and AVX2 fast paths (kernels_avx2.cc), chosen at run
// time by the unqualified wrappers. SIMD results equal the scalar ones bit
// for bit (same operations in the same order, no FMA contraction).
//
// Packed codes: `bits` (2, 4 or 8) per code, LSB-first within each byte,
// code i at bit i*bits; `first` is the index of the first code wanted
// (fast paths need first * bits % 8 == 0 and fall back otherwise).
#pragma once

#include <cstddef>
#include <cstdint>

namespace flatkv::codec {

struct Kernels {
  // x[i] *= sign[i] (+1/-1 floats), then an unnormalised in-place
  // Walsh-Hadamard transform of each block of `block` (a power of two)
  // elements, then x[i] *= scale. n is a multiple of block.
  void (*sign_fwht)(float* x, const float* sign, size_t n, size_t block, float scale);
  // The inverse: FWHT of each block, then x[i] *= sign[i] * scale.
  void (*fwht_sign)(float* x, const float* sign, size_t n, size_t block, float scale);
  // out[i] = lo + step * code(i), codes from `packed` starting at `first`.
  void (*dequant_scalar)(const uint8_t* packed, int bits, size_t first, size_t n, float lo, float step, float* out);
  // out[i] = lo[i] + step[i] * code(i).
  void (*dequant_vec)(const uint8_t* packed, int bits, size_t first, size_t n, const float* lo, const float* step,
                      float* out);
  // pred's RoPE-step prediction over channel pairs (2i, 2i+1), n even:
  // out[c] = prev[c] * cs[c] + prev[c ^ 1] * sn[c] (sn is -sin at even c,
  // +sin at odd c); a NaN result becomes 0, so every path agrees.
  void (*rope_predict)(const float* prev, const float* cs, const float* sn, float* out, size_t n);
  // pred's reconstruction while tokens are plain (1..254): out[i] =
  // dtype(pred[i] + float(q) * step) with q = unzigzag(tok[i] - 1).
  // Returns how many elements it did; stops early (possibly before a plain
  // token) at escapes (0, 255) or anything the fast path does not take, and
  // may have written out[] past that point (below n): the caller rewrites it.
  size_t (*pred_reconstruct)(const uint8_t* tok, const float* pred, float* out, size_t n, float step, int dtype);
};

// The kernels for the detected SIMD level (common/cpu.h).
const Kernels& ActiveKernels();
const Kernels& ScalarKernels();
// Null when this build or CPU lacks AVX2.
const Kernels* Avx2Kernels();

// Quantizes one value to an unsigned code in [0, max_code]: round((x - lo)
// / step), clamped; NaN maps to 0. Never undefined behaviour.
inline uint32_t QuantCode(float x, float lo, float inv_step, uint32_t max_code) {
  const float v = (x - lo) * inv_step + 0.5f;
  if (!(v >= 1.0f)) return 0;
  if (!(v < float(max_code))) return max_code;
  return uint32_t(v);
}

// Packs n codes (each < 2^bits, bits in 1..8) LSB-first into `out`
// (ceil(n * bits / 8) bytes, zeroed first).
void PackCodes(const uint8_t* codes, size_t n, int bits, uint8_t* out);
// The inverse for any bits in 1..8, from code index `first`.
void UnpackCodes(const uint8_t* packed, int bits, size_t first, size_t n, uint8_t* out);

}  // namespace flatkv::codec
