// The inputs and measurements of `flatkv bench codecs` (bench_codecs.cc):
// a Dataset is one sequence's K, V and Q per layer, cut into store slices;
// EvalCodec runs a codec setting over every slice and measures what the
// decoded K, V do to the data and to attention.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flatkv/codec.h"
#include "flatkv/status.h"

namespace flatkv::tools {

struct Dataset {
  std::string name;
  KvShape shape;  // MHA; dtype is what the codecs see (bf16 by default)
  uint32_t layers = 0;
  uint32_t tokens = 0;         // sequence length
  uint32_t block_tokens = 64;  // tokens per slice
  uint32_t q_heads = 0;
  double rope_theta = 0;
  // Per layer: K and V [token][kv_head][dim], Q [token][q_head][dim], f32
  // (K and V already rounded to shape.dtype: the codecs' exact input).
  std::vector<std::vector<float>> k, v, q;
  std::vector<uint32_t> query_positions;  // where attention error is measured
  std::vector<int> tokens_ids;            // for end-to-end runs (real data only)
};

// The slice of `layer`, block `b` in the dataset's dtype (codec layout).
SliceLayout SliceOf(const Dataset& d, uint32_t layer, uint32_t b);
std::vector<std::byte> SliceBytes(const Dataset& d, uint32_t layer, uint32_t b);
uint32_t Blocks(const Dataset& d);

struct Quality {
  uint64_t elements = 0, encoded_bytes = 0;
  double bits_per_element = 0;
  double max_abs_err = 0, rel_mse = 0;
  double attn_output_rel_err = 0;  // ||o' - o|| / ||o|| over all measured queries and heads
  double attn_score_rmse = 0;      // RMS of (q.k' - q.k) / sqrt(d) over causal pairs
  double attn_score_rel = 0;       // that over the RMS of the scores themselves
};

// Encodes and decodes every slice with `codec` (slices whose tokens all lie
// in the last `recent_tokens` of the sequence are kept exact, counted at
// the dtype's size: KIVI's recent window) and measures the result. When
// `decoded` is not null it receives the decoded K and V per layer.
Result<Quality> EvalCodec(const Dataset& d, const Codec& codec, uint32_t recent_tokens,
                          std::vector<std::vector<float>>* decoded_k = nullptr,
                          std::vector<std::vector<float>>* decoded_v = nullptr);

// Every slice of a dataset, encoded as the codecs see it.
struct SliceSet {
  std::vector<SliceLayout> layouts;
  std::vector<std::vector<std::byte>> in;
  uint64_t bytes = 0;
};
SliceSet Slices(const Dataset& d);

// Single-core speeds (bench_codecs.cc): raw input bytes per CPU-second of
// the measuring thread, each pass repeated for at least min_seconds.
struct Speed {
  double encode_gbps = 0, decode_gbps = 0;
};
Result<Speed> MeasureSpeed(const SliceSet& s, const Codec& codec, double min_seconds);
struct Baselines {
  double memcpy_gbps = 0, zstd1_ratio = 0, zstd1_compress_gbps = 0, zstd1_decompress_gbps = 0;
};
Baselines MeasureBaselines(const SliceSet& s, double min_seconds);

// `spec` with rope_theta=THETA added (pred undoes RoPE on keys with it).
std::string WithTheta(const std::string& spec, double theta);
// The largest pred eps (log grid, then bisection) keeping attention-output
// error below `target` on `d`; `extra` is appended to the spec.
Result<double> SearchEps(const Dataset& d, double target, bool quick, const std::string& extra);

// Synthetic Llama-3.1-8B-shaped sequence (codec/synthetic_kv.h).
Dataset SyntheticLlamaDataset(uint32_t tokens, uint32_t layers, DType dtype);
// Reads a `flatkv dump-kv` file (docs/format_kv_dump.md).
Result<Dataset> ReadKvDump(const std::string& path, DType dtype);

}  // namespace flatkv::tools
