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

// One query-head group's attention at one position p: heads g = 0..group-1
// read q + g * hs (after RoPE) and the cache's K/V rows 0..p at `layer`,
// columns kv_off..kv_off + hs - 1, and write o + g * hs (hs floats each):
// scores Dot(q_g, k_s, hs) / sqrt_hs for s = 0..p, softmax (max, Exp,
// fp::Sum, divide), then o = sum over s = 0..p in order of att[s] * v_s.
// scratch: att (p + 1).
using AttendFn = void (*)(const float* q, int group, int hs, const KvCache& cache, int layer, int kv_off, uint32_t p,
                          float sqrt_hs, float* att, float* o);

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
