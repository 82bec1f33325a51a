// The transformer's two hot loops, matmul and attention, as kernels chosen
// at run time (common/cpu.h): a scalar reference and AVX2 / AVX-512 fast
// paths (kernels_avx2.cc, kernels_avx512.cc) that give its results bit for
// bit. Every output element is reduced in the reference order of
// model/fp_math.h (fp::Dot's 8 lanes and tree for a matmul output and an
// attention score, one multiply and one add per term, no FMA), so the
// transformer's determinism rule (model/transformer.h) holds whichever
// kernel runs and however the work is split across threads: each call
// computes a disjoint set of outputs, each from its own inputs only.
#pragma once

#include <cstdint>

#include "common/cpu.h"
#include "model/kv_cache.h"

namespace flatkv::model {

// in: x (n, in), w (out, in), rows [r0, r1) of w; out: y (n, out) at those
// rows only: y[t * out + i] = fp::Dot(x + t * in, w + i * in, in).
using MatMulRowsFn = void (*)(const float* x, const float* w, int n, int in, int out, int r0, int r1, float* y);

// Attention of a block of queries sharing one kv head: tokens t = 0..nt-1
// at ascending positions pos[t], query heads g = 0..group-1 of each, query
// (t, g) at q + t * q_stride + g * hs (after RoPE), output at
// o + t * q_stride + g * hs (hs floats). Query (t, g) reads the cache's K/V
// rows 0..pos[t] at `layer`, columns kv_off..kv_off + hs - 1: scores
// Dot(q, k_s, hs) / sqrt_hs for s = 0..pos[t], softmax (max, Exp, fp::Sum,
// divide), then o = sum over s = 0..pos[t] in order of att[s] * v_s. Each
// output depends on its own query and keys only, never on nt or on the
// other queries (the fast paths share each K/V block's loads across them).
// scratch: att (nt * group * (pos[nt - 1] + 1)).
using AttendFn = void (*)(const float* q, int q_stride, const uint32_t* pos, int nt, int group, int hs,
                          const KvCache& cache, int layer, int kv_off, float sqrt_hs, float* att, float* o);

struct Kernels {
  SimdLevel level;
  MatMulRowsFn matmul_rows;
  AttendFn attend;
};

// The kernels for `level` (the best compiled one at or below it).
const Kernels& KernelsFor(SimdLevel level);
// KernelsFor(DetectedSimd()).
const Kernels& DefaultKernels();

namespace internal {
const Kernels& ScalarKernels();
const Kernels* Avx2Kernels();    // null when not compiled for x86-64
const Kernels* Avx512Kernels();  // null when not compiled for x86-64
}  // namespace internal

}  // namespace flatkv::model
