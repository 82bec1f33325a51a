// Synthetic KV slices shaped like Llama-3.1-8B's (head_dim 128, RoPE theta
// 500000), for benchmarks and tests that need realistic-looking data
// without a model.
//
// Keys: per head a fixed "mean direction" with a few large-magnitude
// outlier channels (about 4 of 128 per head, 8-15x the typical magnitude),
// plus a slowly drifting per-token component (AR(1), so consecutive tokens
// are correlated), then rotated by RoPE at each token's position: channel
// pairs (2f, 2f+1) turn by pos * theta^(-2f/head_dim), the interleaved
// convention of src/model/transformer.cc. Values: per-token, smoother,
// roughly unit scale with a per-head scale and no outlier channels.
// MLA: the latent part is value-like, the rope part key-like.
//
// Positions are layout.first_position + t (0 + t when unknown). The same
// (layout, seed) always gives the same bytes; a sequence split into slices
// with consecutive first_position and the same seed is one continuous
// sequence (each token's drift is derived from its absolute position).
#pragma once

#include <cstdint>
#include <span>

#include "flatkv/codec.h"

namespace flatkv::codec {

inline constexpr double kSyntheticRopeTheta = 500000.0;

// Fills `out` (layout.Bytes() bytes, layout.shape.dtype) with one slice in
// the layout of flatkv/codec.h.
void FillSyntheticKv(const SliceLayout& layout, uint64_t seed, std::span<std::byte> out);

// Queries matching FillSyntheticKv(layout, seed): for each token of the
// slice, `query_heads` (a multiple of kv_heads for MHA; any for MLA)
// vectors of head_dim (MHA) or latent_dim + rope_dim (MLA, absorbed
// queries) floats, RoPE'd at the token's position, laid out
// [token][query_head][dim]. Queries lean towards their KV head's key
// directions, so attention is peaked like a real model's.
// out.size() must be layout.tokens * query_heads * dim.
void FillSyntheticQueries(const SliceLayout& layout, uint32_t query_heads, uint64_t seed, std::span<float> out);

}  // namespace flatkv::codec
