// A reusable chunk's KV (docs/blend.md, docs/c_api.md "Chunks") in its two
// layouts, and the re-rotation that places it at new positions. Used by the
// reference engine (engine/engine_blend.cc) and the C API
// (capi/capi_chunks.cc), so the blocks either stores are the same.
//
// Chunk rows: layer l of an n-token chunk at l * n * token_layer_bytes; in
// it, MHA/GQA: n K rows then n V rows (a row: kv_heads * head_dim elements,
// head-major, in the shape's dtype); MLA: n rows of latent_dim + rope_dim
// elements, the RoPE key last. Keys are kept before RoPE.
// Chunk blocks: ceil(n / block_tokens) store blocks in put's block-major
// layout; a block's layer slice holds its block_tokens rows the same way
// (K rows, then V rows), zero past a partial block's length.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flatkv/shape.h"
#include "flatkv/status.h"
#include "model/rope.h"

namespace flatkv::model {

struct ChunkLayout {
  KvShape shape;
  uint32_t block_tokens = 0;
  uint64_t block_layer_bytes = 0;  // >= block_tokens * token_layer_bytes()

  explicit ChunkLayout(const KvShape& s, uint32_t bt, uint64_t block_layer);
  uint64_t row_bytes() const { return row_bytes_; }  // one token's K (MHA) or whole row (MLA)
  uint32_t parts() const { return parts_; }          // 2 (K, V) for MHA, 1 for MLA
  uint64_t token_layer_bytes() const { return row_bytes_ * parts_; }
  uint64_t block_bytes() const { return block_layer_bytes * shape.layers; }
  uint64_t blocks(uint64_t n) const { return (n + block_tokens - 1) / block_tokens; }
  uint64_t rows_bytes(uint64_t n) const { return uint64_t{shape.layers} * n * token_layer_bytes(); }

  // rows (n tokens) -> blocks (blocks(n) of block_bytes(), zeroed by the caller).
  void RowsToBlocks(const std::byte* rows, uint64_t n, std::byte* blocks) const;
  // blocks -> the first `count` tokens of rows laid out for n tokens.
  void BlocksToRows(const std::byte* blocks, uint64_t n, uint64_t count, std::byte* rows) const;
  // One layer of it: block b's slice of `layer` at slices + b * stride (a
  // restore's window view has stride block_layer_bytes).
  void LayerToRows(uint32_t layer, const std::byte* slices, uint64_t stride, uint64_t n, uint64_t count,
                   std::byte* rows) const;

 private:
  uint64_t row_bytes_ = 0;
  uint32_t parts_ = 1;
};

// Where RoPE applies in a K row of `shape`, and with which parameters.
struct ChunkRope {
  RopeSpec spec;
  uint32_t heads = 0, head_dim = 0, offset = 0, row_elements = 0;
};

// Checks `spec` against the shape (rotary_dim even and within a head, or
// 0 for all of it) and positions pos0 .. pos0 + n - 1 against 2^32 - 1.
Result<ChunkRope> PlanChunkRope(const RopeSpec& spec, const KvShape& shape, uint64_t pos0, uint64_t n);

// Rotates the K rows of every layer of chunk rows (n tokens, the first
// `count` of them valid) to positions pos0.. . f32 in place (bit for bit a
// prefill's key); f16/bf16 through float, rounded to nearest once.
void RotateChunkKeys(std::byte* rows, const ChunkLayout& layout, uint64_t n, uint64_t count, uint64_t pos0,
                     const ChunkRope& rope);

}  // namespace flatkv::model
