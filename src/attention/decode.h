// Decode attention on the CPU over a 16-bit (IEEE f16) cache: one new
// query per head attends over every cached token of one layer.
//
// Layout (per KV head contiguous, the way a paged engine keeps a head's
// pages): k[kvh * head_stride + t][d] and v likewise, f16, t < n_tokens <=
// head_stride. Query head h reads KV head h / (n_heads / n_kv_heads).
//
// DenseDecode is split-K "flash decoding": work items are (KV head, chunk of
// chunk_tokens tokens); each computes, for the G query heads of its KV head,
// a partial (max m, sum l = sum exp(s - m), acc = sum exp(s - m) v) with an
// online softmax, spread over `threads` threads; partials are merged per head
// in chunk order by log-sum-exp (MergePartial), so the result does not depend
// on the thread count. Quest (quest.h) and the certified sampler
// (certified_sampler.h) build on the same kernels.
//
// Thread-safety: functions are reentrant; caches are read-only.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "attention/decode_kernels.h"
#include "common/cpu.h"
#include "flatkv/status.h"

namespace flatkv::attention {

struct F16Cache {
  int n_kv_heads = 0;
  int head_dim = 0;
  uint32_t n_tokens = 0;
  uint64_t head_stride = 0;  // tokens between KV heads (>= n_tokens)
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;

  const uint16_t* k_row(int h, uint64_t t) const { return k + (h * head_stride + t) * head_dim; }
  const uint16_t* v_row(int h, uint64_t t) const { return v + (h * head_stride + t) * head_dim; }
  Status Validate(int n_heads, size_t q_floats, size_t out_floats) const;
};

struct DecodeOptions {
  int threads = 1;                // worker threads (the caller's included), >= 1
  uint32_t chunk_tokens = 512;    // tokens per work item; partials merged by log-sum-exp
  SimdLevel simd = DetectedSimd();  // capped by what the CPU has
};

// One head's online-softmax state over some keys.
struct Partial {
  float m = -INFINITY;  // max score seen
  double l = 0;         // sum of exp(s - m)
  std::vector<float> acc;  // sum of exp(s - m) v, head_dim floats
};
// a := a merged with b (log-sum-exp rescaling).
void MergePartial(Partial& a, const Partial& b);

// out[h][d] = softmax(q[h] . K / sqrt(d)) V for n_heads query heads.
[[nodiscard]] Status DenseDecode(const F16Cache& cache, int n_heads, std::span<const float> q, std::span<float> out,
                                 const DecodeOptions& o = {});
// The same in double precision, one head at a time (the exact reference
// the tests and benchmarks measure errors against). Also returns, when
// `weights` is given, each head's attention weights [h][t].
void ExactDecode(const F16Cache& cache, int n_heads, std::span<const float> q, std::span<float> out,
                 std::vector<std::vector<double>>* weights = nullptr);

// Runs fn(item) for item in [0, items) on `threads` threads (the caller's one included).
void ParallelFor(int threads, size_t items, const std::function<void(size_t item)>& fn);

// Partials of the G query heads of KV head `kvh` over tokens [t0, t1) (one
// call of the kernels; `scratch` grows as needed). Shared by the decoders.
void ChunkPartials(const DecodeKernels& k, const F16Cache& cache, int kvh, int group, const float* q_group,
                   uint32_t t0, uint32_t t1, std::vector<float>& scratch, Partial* out);

}  // namespace flatkv::attention
