// Synthetic decode caches with realistic score concentration, for tests and
// `flatkv bench attention`: per KV head, keys are N(0, 1) per channel (a
// query's logit q . k / sqrt(d) over them is about N(0, bulk_std^2)), plus
// attention sinks (the first tokens, high logits), a few heavy hitters at
// random positions, and a recency window whose logits ramp up towards the
// newest token. Heads differ in concentration: head g's special logits are
// scaled by a factor in [dispersed_scale, 1] (low = a dispersed head). The
// query heads of a group share a direction (GQA heads attend alike) plus
// their own noise. Values are N(0, 1). Deterministic in `seed`.
#pragma once

#include <cstdint>
#include <vector>

#include "attention/decode.h"

namespace flatkv::attention {

struct SyntheticOptions {
  int n_heads = 32;
  int n_kv_heads = 8;
  int head_dim = 128;
  uint32_t n_tokens = 4096;
  uint32_t sinks = 4;
  float sink_logit = 14.0f;
  uint32_t heavy = 32;
  float heavy_logit = 11.0f;     // heavy hitters' logits spread over [heavy_logit - 2, heavy_logit + 2]
  uint32_t local = 512;
  float local_logit = 8.0f;      // the newest token's; ramps down to local_logit - 4 over the window
  float bulk_std = 1.0f;
  float dispersed_scale = 0.6f;  // the most dispersed head's special-logit factor
  uint64_t seed = 1;
  int threads = 1;
};

struct SyntheticCache {
  std::vector<uint16_t> k, v;  // [kvh][t][d] f16, head_stride = n_tokens
  std::vector<float> q;        // [h][d]
  F16Cache View(uint32_t n_tokens) const;  // the first n_tokens of each head
  int n_kv_heads = 0, head_dim = 0;
  uint32_t capacity = 0;
};

SyntheticCache MakeSyntheticCache(const SyntheticOptions& o);

}  // namespace flatkv::attention
