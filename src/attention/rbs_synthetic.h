// A synthetic long prompt for sparse prefill (`flatkv bench sparse-prefill`,
// the synthetic part; attention/rbs.h): per head, keys and values for every
// position and queries for chosen query blocks, after RoPE (interleaved,
// base rope_theta), with the structure block-sparse prefill has to find:
//
//   locality  q and k share a per-head direction mu (pre-RoPE) in the
//             faster-rotating half of the channels, so under RoPE a query's
//             logits fall off with distance over a few hundred positions
//             (local_logit at distance 0, per head);
//   sinks     keys 0..sinks-1 carry a sink direction every query holds
//             (sink_logit), in the slowest-rotating RoPE pairs;
//   needles   one key in every `needle_every` key blocks (at a random
//             offset) carries a direction of its own in the slowest pairs;
//             each query block of a retrieval head seeks one earlier needle
//             (needle_logit). Its block's centroid dilutes it 1/block:
//             the case RBS's rescue branch is for;
//   bulk      every q and k channel has N(0, noise^2) noise (a bulk logit
//             spread near 1, as attention/synthetic.h's); values are N(0, 1).
//
// Heads differ: head h's local_logit and needle_logit are scaled by
// per-head factors, and the last head seeks no needles (a streaming head).
// Deterministic in `seed`.
#pragma once

#include <cstdint>
#include <vector>

namespace flatkv::attention {

struct PrefillSyntheticOptions {
  int heads = 4;           // query heads = KV heads
  int head_dim = 64;
  uint32_t n_tokens = 32768;
  uint32_t block = 64;
  double rope_theta = 1e6;
  float local_logit = 8.0f;
  float noise = 0.5f;
  uint32_t sinks = 4;
  float sink_logit = 14.0f;
  uint32_t needle_every = 8;  // key blocks per needle
  float needle_logit = 13.0f;
  uint64_t seed = 1;
};

struct PrefillSynthetic {
  int heads = 0, head_dim = 0;
  uint32_t n_tokens = 0;
  std::vector<float> k, v;          // [h][t][d]
  std::vector<uint32_t> qblocks;    // the query blocks generated
  std::vector<float> q;             // [h][qblocks.size() * block rows][d]; rows past n_tokens are zero
  std::vector<uint32_t> needles;    // needle positions
  const float* head_k(int h) const { return k.data() + uint64_t(h) * n_tokens * head_dim; }
  const float* head_v(int h) const { return v.data() + uint64_t(h) * n_tokens * head_dim; }
};

// Keys and values for every position; queries for the rows of `qblocks`.
PrefillSynthetic MakePrefillSynthetic(const PrefillSyntheticOptions& o, const std::vector<uint32_t>& qblocks);

}  // namespace flatkv::attention
