#include "model/chunk_kv.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "codec/dtype.h"

namespace flatkv::model {

ChunkLayout::ChunkLayout(const KvShape& s, uint32_t bt, uint64_t block_layer)
    : shape(s), block_tokens(bt), block_layer_bytes(block_layer) {
  const uint64_t e = DTypeBytes(s.dtype);
  if (s.kind == AttentionKind::kMha) {
    row_bytes_ = uint64_t{s.kv_heads} * s.head_dim * e;
    parts_ = 2;
  } else {
    row_bytes_ = (uint64_t{s.latent_dim} + s.rope_dim) * e;
    parts_ = 1;
  }
}

void ChunkLayout::RowsToBlocks(const std::byte* rows, uint64_t n, std::byte* blocks) const {
  const uint64_t layer_rows = n * token_layer_bytes();
  for (uint32_t l = 0; l < shape.layers; ++l)
    for (uint32_t part = 0; part < parts_; ++part)
      for (uint64_t t = 0; t < n; ++t)
        std::memcpy(blocks + (t / block_tokens) * block_bytes() + l * block_layer_bytes +
                        (part * block_tokens + t % block_tokens) * row_bytes_,
                    rows + l * layer_rows + (part * n + t) * row_bytes_, row_bytes_);
}

void ChunkLayout::BlocksToRows(const std::byte* blocks, uint64_t n, uint64_t count, std::byte* rows) const {
  for (uint32_t l = 0; l < shape.layers; ++l) LayerToRows(l, blocks + l * block_layer_bytes, block_bytes(), n, count, rows);
}

void ChunkLayout::LayerToRows(uint32_t layer, const std::byte* slices, uint64_t stride, uint64_t n, uint64_t count,
                              std::byte* rows) const {
  std::byte* out = rows + layer * n * token_layer_bytes();
  for (uint32_t part = 0; part < parts_; ++part)
    for (uint64_t t = 0; t < count; ++t)
      std::memcpy(out + (part * n + t) * row_bytes_,
                  slices + (t / block_tokens) * stride + (part * block_tokens + t % block_tokens) * row_bytes_,
                  row_bytes_);
}

Result<ChunkRope> PlanChunkRope(const RopeSpec& spec, const KvShape& shape, uint64_t pos0, uint64_t n) {
  ChunkRope p;
  if (!(std::isfinite(spec.theta) && spec.theta > 0))
    return Status::InvalidArgument("rope.theta is " + std::to_string(spec.theta) + ", expected a finite value > 0");
  if (spec.style != RopeStyle::kInterleaved && spec.style != RopeStyle::kNeox)
    return Status::InvalidArgument("unknown rope.style " + std::to_string(int(spec.style)) +
                                   " (FLATKV_ROPE_INTERLEAVED=1, FLATKV_ROPE_NEOX=2)");
  const bool mha = shape.kind == AttentionKind::kMha;
  if (mha) {
    p.heads = shape.kv_heads, p.head_dim = shape.head_dim, p.offset = 0;
    p.row_elements = shape.kv_heads * shape.head_dim;
  } else {  // MLA: one RoPE key after the latent
    p.heads = 1, p.head_dim = shape.rope_dim, p.offset = shape.latent_dim;
    p.row_elements = shape.latent_dim + shape.rope_dim;
  }
  const uint32_t rotary = spec.rotary_dim == 0 ? p.head_dim : spec.rotary_dim;
  if (rotary % 2 != 0 || rotary > p.head_dim)
    return Status::InvalidArgument("rope.rotary_dim is " + std::to_string(spec.rotary_dim) +
                                   ", expected an even value <= " + std::to_string(p.head_dim) + " (the " +
                                   (mha ? "head dim" : "RoPE key width") + ") or 0");
  constexpr uint64_t kMaxPos = std::numeric_limits<uint32_t>::max();
  if (pos0 > kMaxPos || n > kMaxPos || pos0 + n - 1 > kMaxPos)
    return Status::InvalidArgument("positions pos0 " + std::to_string(pos0) + " .. " + std::to_string(pos0 + n - 1) +
                                   " exceed 2^32 - 1");
  p.spec = spec;
  p.spec.rotary_dim = rotary;
  return p;
}

void RotateChunkKeys(std::byte* rows, const ChunkLayout& layout, uint64_t n, uint64_t count, uint64_t pos0,
                     const ChunkRope& rope) {
  constexpr uint64_t kBatch = 256;  // rows converted per pass
  const DType dtype = layout.shape.dtype;
  const uint64_t row_bytes = uint64_t{rope.row_elements} * DTypeBytes(dtype);
  std::vector<uint32_t> pos(std::min(count, kBatch));
  std::vector<float> f;
  for (uint32_t l = 0; l < layout.shape.layers; ++l) {
    std::byte* k = rows + l * n * layout.token_layer_bytes();
    for (uint64_t t0 = 0; t0 < count; t0 += kBatch) {
      const uint32_t m = static_cast<uint32_t>(std::min(kBatch, count - t0));
      for (uint32_t i = 0; i < m; ++i) pos[i] = static_cast<uint32_t>(pos0 + t0 + i);
      std::byte* p = k + t0 * row_bytes;
      if (dtype == DType::kF32) {
        ApplyRope(reinterpret_cast<float*>(p), m, rope.row_elements, rope.offset, rope.heads, rope.head_dim, pos.data(),
                  rope.spec);
        continue;
      }
      f.resize(size_t{m} * rope.row_elements);
      codec::ToFloat(dtype, p, f.data(), f.size());
      ApplyRope(f.data(), m, rope.row_elements, rope.offset, rope.heads, rope.head_dim, pos.data(), rope.spec);
      codec::FromFloat(dtype, f.data(), p, f.size());
    }
  }
}

}  // namespace flatkv::model
