// RoPE (rotary position embedding), the one implementation: the forward
// pass rotates queries and keys with it (model/transformer.cc), and chunk
// reuse rotates keys stored before RoPE to their new positions with it
// (Transformer::RotateKeys, the C API's flatkv_store_restore_chunk), so a
// re-rotated key is bit for bit the key a prefill would have written.
//
// Frequency f of a head rotates the pair (a, b) by the angle
// pos x theta^(-2f / rotary_dim), f = 0 .. rotary_dim/2 - 1:
//   kInterleaved  a = v[2f], b = v[2f + 1]           (llama2.c, Meta's llama, GPT-J)
//   kNeox         a = v[f],  b = v[f + rotary_dim/2] (GPT-NeoX, Hugging Face and vLLM llama)
// Elements past rotary_dim are left as they are (partial rotary). Angles and
// their cos/sin are computed in double and rounded once to float, then
// a' = a cos - b sin, b' = a sin + b cos in float, each product rounded on
// its own (the build disables FMA contraction), so results do not depend on
// the code path.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flatkv::model {

enum class RopeStyle : uint8_t { kInterleaved = 1, kNeox = 2 };

struct RopeSpec {
  double theta = 10000.0;
  uint32_t rotary_dim = 0;  // elements rotated at the start of each head, even; 0: the whole head
  RopeStyle style = RopeStyle::kInterleaved;
};

// Rotates n rows in place: row t (at rows + t * row_stride) holds `heads`
// heads of head_dim floats starting at its element `offset`, and is at
// position pos[t]. rotary_dim (resolved against head_dim) must be even and
// at most head_dim; the caller checks.
void ApplyRope(float* rows, uint32_t n, size_t row_stride, uint32_t offset, uint32_t heads, uint32_t head_dim,
               const uint32_t* pos, const RopeSpec& spec);

}  // namespace flatkv::model
