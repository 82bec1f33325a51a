// Block-sparse prefill attention kernels (RBS-Attention, attention/rbs.h):
// one query block of rows against a list of key blocks, in fp32, with an
// online softmax (flash attention's running max and sum) so a row never
// holds more than one key block's scores.
//
// Keys and values are addressed as blocks: row t of key block j is
//   k.base + j * k.block_stride + t * k.row_stride   (d floats; the same for v)
// which covers both the engine's KvCache pages (block_stride = one page,
// row_stride = kv_dim, base offset by the head) and plain [t][d] arrays.
//
// BlockAttend: rows r = 0..rows-1 at positions pos[r] (ascending); for each
// listed key block j (ascending), keys at positions j * block + t (t <
// block) that are <= pos[r] enter row r's softmax with logit
// scale * (q_r . k); o_r = sum p v / sum p, lse_r = log sum exp(logit) (so
// exp(lse_sparse - lse_dense) is the share of the attention mass a mask
// keeps, since its sum is a subset of the dense one). A row that sees no
// key gets o = 0 and lse = -inf.
//
// The scalar version (rbs_kernels.cc) is the reference; rbs_kernels_avx2.cc
// has the AVX2/FMA one (a key block is transposed once and shared by every
// row), chosen at run time. They agree to float rounding, not bit for bit.
#pragma once

#include <cstdint>
#include <vector>

#include "common/cpu.h"

namespace flatkv::attention {

struct BlockRows {
  const float* base = nullptr;
  uint64_t block_stride = 0;  // floats between key block j and j + 1
  uint64_t row_stride = 0;    // floats between rows of one block
  const float* row(uint32_t j, uint32_t t) const { return base + j * block_stride + t * row_stride; }
};

struct BlockAttendArgs {
  const float* q = nullptr;  // row r at q + r * q_stride, d floats (after RoPE)
  uint64_t q_stride = 0;
  const uint32_t* pos = nullptr;  // rows positions, ascending
  uint32_t rows = 0;
  int d = 0;
  float scale = 0;  // usually 1 / sqrt(d)
  BlockRows k, v;
  uint32_t block = 64;           // keys per block
  const uint32_t* blocks = nullptr;  // key block ids, ascending
  uint32_t n_blocks = 0;
  float* o = nullptr;  // row r at o + r * o_stride, d floats
  uint64_t o_stride = 0;
  float* lse = nullptr;  // rows floats, or null
};

// Scratch a kernel needs, owned by the caller (one per thread).
struct BlockAttendScratch {
  std::vector<float> kt, s, m, l;
};

struct RbsKernels {
  SimdLevel level;
  void (*attend)(const BlockAttendArgs& a, BlockAttendScratch& scratch);
  // out[b] = scale * dot(q, c_b) for b < n rows of `c` (stride d): the mask's
  // centroid scores.
  void (*dots)(const float* q, const float* c, uint32_t n, int d, float scale, float* out);
};

const RbsKernels& RbsScalarKernels();
const RbsKernels* RbsAvx2Kernels();  // null when not compiled for x86-64
// The best compiled kernels at or below `level`.
const RbsKernels& RbsKernelsFor(SimdLevel level);

}  // namespace flatkv::attention
