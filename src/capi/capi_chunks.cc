// The chunk calls of the C API (include/flatkv/flatkv.h, "chunks";
// docs/blend.md): chunk keys, and chunk KV moved between the caller's chunk
// rows and the store's blocks, with keys re-rotated on the way out
// (model/rope.h, the rotation the reference engine's prefill applies).
// Built on the Backend's Match / Put / Restore, so an embedded store and a
// daemon client behave the same.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "capi/capi_internal.h"
#include "codec/dtype.h"
#include "model/rope.h"

using flatkv::BlockKey;
using flatkv::KvShape;
using flatkv::Status;
using flatkv::capi::Geometry;
using flatkv::capi::Guard;

namespace {

// Where a token's K (and V) sit: in chunk rows, n rows per part; in a
// block's layer slice, block_tokens rows per part.
struct RowGeometry {
  uint64_t row_bytes = 0;  // one token's K (MHA) or its whole latent + RoPE row (MLA)
  uint32_t parts = 1;      // 2 for MHA (K rows, then V rows), 1 for MLA
  uint64_t token_layer_bytes() const { return row_bytes * parts; }
};

RowGeometry RowsOf(const KvShape& shape) {
  RowGeometry r;
  const uint64_t e = flatkv::DTypeBytes(shape.dtype);
  if (shape.kind == flatkv::AttentionKind::kMha) {
    r.row_bytes = uint64_t{shape.kv_heads} * shape.head_dim * e;
    r.parts = 2;
  } else {
    r.row_bytes = (uint64_t{shape.latent_dim} + shape.rope_dim) * e;
  }
  return r;
}

// Byte offset of part p (0: K, 1: V) of token t in chunk rows of n tokens
// (layer excluded) and in a block's layer slice.
uint64_t ChunkRow(const RowGeometry& r, uint64_t n, uint32_t part, uint64_t t) {
  return (part * n + t) * r.row_bytes;
}
uint64_t SliceRow(const RowGeometry& r, uint32_t block_tokens, uint32_t part, uint64_t t) {
  return (uint64_t{part} * block_tokens + t % block_tokens) * r.row_bytes;
}

Status CheckCommon(const flatkv_store* store, const flatkv_namespace* ns, const uint32_t* tokens, uint64_t n_tokens) {
  if (store == nullptr) return Status::InvalidArgument("store is NULL");
  if (ns == nullptr) return Status::InvalidArgument("namespace is NULL");
  if (n_tokens == 0) return Status::InvalidArgument("the chunk is empty (n_tokens 0)");
  if (tokens == nullptr) return Status::InvalidArgument("tokens is NULL with n_tokens " + std::to_string(n_tokens));
  const uint64_t max_tokens = uint64_t{std::numeric_limits<uint32_t>::max()};
  if (n_tokens > max_tokens) return Status::InvalidArgument("n_tokens " + std::to_string(n_tokens) + " exceeds 2^32 - 1");
  return Status::Ok();
}

std::vector<BlockKey> ChunkKeysOf(const flatkv_namespace* ns, const uint32_t* tokens, uint64_t n, uint32_t bt) {
  return ns->hasher.ChunkKeys(ns->digest, std::span<const uint32_t>(tokens, n), bt);
}

// The RoPE to apply, checked against the shape: heads, head width and where
// the rotated part starts in a K row.
struct RopePlan {
  flatkv::model::RopeSpec spec;
  uint32_t heads = 0, head_dim = 0, offset = 0, row_elements = 0;
};

flatkv::Result<RopePlan> PlanRope(const flatkv_rope& rope, const KvShape& shape, uint64_t pos0, uint64_t n) {
  RopePlan p;
  if (!(std::isfinite(rope.theta) && rope.theta > 0))
    return Status::InvalidArgument("rope.theta is " + std::to_string(rope.theta) + ", expected a finite value > 0");
  if (rope.style == FLATKV_ROPE_INTERLEAVED)
    p.spec.style = flatkv::model::RopeStyle::kInterleaved;
  else if (rope.style == FLATKV_ROPE_NEOX)
    p.spec.style = flatkv::model::RopeStyle::kNeox;
  else
    return Status::InvalidArgument("unknown rope.style " + std::to_string(rope.style) +
                                   " (FLATKV_ROPE_INTERLEAVED=1, FLATKV_ROPE_NEOX=2)");
  if (shape.kind == flatkv::AttentionKind::kMha) {
    p.heads = shape.kv_heads, p.head_dim = shape.head_dim, p.offset = 0;
    p.row_elements = shape.kv_heads * shape.head_dim;
  } else {  // MLA: one RoPE key after the latent
    p.heads = 1, p.head_dim = shape.rope_dim, p.offset = shape.latent_dim;
    p.row_elements = shape.latent_dim + shape.rope_dim;
  }
  const uint32_t rotary = rope.rotary_dim == 0 ? p.head_dim : rope.rotary_dim;
  if (rotary % 2 != 0 || rotary > p.head_dim)
    return Status::InvalidArgument("rope.rotary_dim is " + std::to_string(rope.rotary_dim) + ", expected an even value <= " +
                                   std::to_string(p.head_dim) + " (the " +
                                   (shape.kind == flatkv::AttentionKind::kMha ? "head dim" : "RoPE key width") +
                                   ") or 0");
  p.spec.theta = rope.theta;
  p.spec.rotary_dim = rotary;
  if (pos0 > std::numeric_limits<uint32_t>::max() || pos0 + n - 1 > std::numeric_limits<uint32_t>::max())
    return Status::InvalidArgument("positions pos0 " + std::to_string(pos0) + " .. " + std::to_string(pos0 + n - 1) +
                                   " exceed 2^32 - 1");
  return p;
}

// Rotates `count` K rows in chunk rows (row 0 at `k`) to positions pos0.. .
void RotateRows(std::byte* k, uint64_t count, uint64_t pos0, const RopePlan& plan, flatkv::DType dtype) {
  constexpr uint64_t kBatch = 256;  // rows converted per pass
  std::vector<uint32_t> pos(std::min(count, kBatch));
  std::vector<float> rows;
  const uint64_t e = flatkv::DTypeBytes(dtype), row_bytes = uint64_t{plan.row_elements} * e;
  for (uint64_t t0 = 0; t0 < count; t0 += kBatch) {
    const uint32_t m = static_cast<uint32_t>(std::min(kBatch, count - t0));
    for (uint32_t i = 0; i < m; ++i) pos[i] = static_cast<uint32_t>(pos0 + t0 + i);
    std::byte* p = k + t0 * row_bytes;
    if (dtype == flatkv::DType::kF32) {
      flatkv::model::ApplyRope(reinterpret_cast<float*>(p), m, plan.row_elements, plan.offset, plan.heads,
                               plan.head_dim, pos.data(), plan.spec);
      continue;
    }
    rows.resize(size_t{m} * plan.row_elements);
    flatkv::codec::ToFloat(dtype, p, rows.data(), rows.size());
    flatkv::model::ApplyRope(rows.data(), m, plan.row_elements, plan.offset, plan.heads, plan.head_dim, pos.data(),
                             plan.spec);
    flatkv::codec::FromFloat(dtype, rows.data(), p, rows.size());
  }
}

}  // namespace

extern "C" {

flatkv_status* flatkv_namespace_chunk_keys(const flatkv_namespace* ns, const uint32_t* tokens, uint64_t n_tokens,
                                           uint32_t block_tokens, flatkv_key* keys, uint64_t keys_capacity,
                                           uint64_t* n_keys) {
  return Guard(__func__, [&]() -> Status {
    if (n_keys) *n_keys = 0;
    if (ns == nullptr) return Status::InvalidArgument("namespace is NULL");
    if (n_keys == nullptr) return Status::InvalidArgument("n_keys is NULL");
    if (n_tokens == 0) return Status::InvalidArgument("the chunk is empty (n_tokens 0)");
    if (tokens == nullptr) return Status::InvalidArgument("tokens is NULL with n_tokens " + std::to_string(n_tokens));
    if (block_tokens == 0) return Status::InvalidArgument("block_tokens is 0");
    const uint64_t n = (n_tokens + block_tokens - 1) / block_tokens;
    if (n > keys_capacity)
      return Status::InvalidArgument(std::to_string(n_tokens) + " tokens make " + std::to_string(n) + " chunk blocks of " +
                                     std::to_string(block_tokens) + ", keys holds " + std::to_string(keys_capacity));
    if (keys == nullptr) return Status::InvalidArgument("keys is NULL");
    const auto k = ChunkKeysOf(ns, tokens, n_tokens, block_tokens);
    for (uint64_t b = 0; b < n; ++b) keys[b] = flatkv_key{k[b].lo, k[b].hi};
    *n_keys = n;
    return Status::Ok();
  });
}

uint64_t flatkv_chunk_session(flatkv_key first_chunk_key) {
  return flatkv::ChunkSession(BlockKey{first_chunk_key.lo, first_chunk_key.hi});
}

uint64_t flatkv_store_token_layer_bytes(const flatkv_store* store) {
  return store ? RowsOf(store->geometry.shape).token_layer_bytes() : 0;
}

flatkv_status* flatkv_store_put_chunk(flatkv_store* store, const flatkv_namespace* ns, const uint32_t* tokens,
                                      uint64_t n_tokens, const void* data, uint64_t data_bytes, uint32_t flags) {
  return Guard(__func__, [&]() -> Status {
    FLATKV_RETURN_IF_ERROR(CheckCommon(store, ns, tokens, n_tokens));
    const Geometry& g = store->geometry;
    const RowGeometry r = RowsOf(g.shape);
    const uint64_t layer_bytes = n_tokens * r.token_layer_bytes(), need = uint64_t{g.layers} * layer_bytes;
    if (data == nullptr) return Status::InvalidArgument("data is NULL");
    if (data_bytes != need)
      return Status::InvalidArgument("data is " + std::to_string(data_bytes) + " bytes, a chunk of " +
                                     std::to_string(n_tokens) + " tokens takes " + std::to_string(g.layers) +
                                     " layers x " + std::to_string(n_tokens) + " tokens x " +
                                     std::to_string(r.token_layer_bytes()) + " bytes = " + std::to_string(need));
    FLATKV_ASSIGN_OR_RETURN(const flatkv::PutHint hint, flatkv::capi::PutHintOf(flags));
    const auto keys = ChunkKeysOf(ns, tokens, n_tokens, g.block_tokens);
    // Put's block-major layout; a partial block's tail stays zero.
    std::vector<std::byte> blocks(keys.size() * g.block_bytes);
    const auto* in = static_cast<const std::byte*>(data);
    for (uint32_t l = 0; l < g.layers; ++l)
      for (uint32_t part = 0; part < r.parts; ++part)
        for (uint64_t t = 0; t < n_tokens; ++t)
          std::memcpy(blocks.data() + (t / g.block_tokens) * g.block_bytes + l * g.block_layer_bytes +
                          SliceRow(r, g.block_tokens, part, t),
                      in + l * layer_bytes + ChunkRow(r, n_tokens, part, t), r.row_bytes);
    return store->backend->Put(flatkv::ChunkSession(keys[0]), keys, blocks, hint);
  });
}

flatkv_status* flatkv_store_lookup_chunks(flatkv_store* store, const flatkv_namespace* ns, const uint32_t* tokens,
                                          uint64_t n_tokens, const flatkv_chunk* chunks, uint64_t n_chunks,
                                          uint64_t* cached_tokens) {
  return Guard(__func__, [&]() -> Status {
    if (store == nullptr) return Status::InvalidArgument("store is NULL");
    if (ns == nullptr) return Status::InvalidArgument("namespace is NULL");
    if (n_chunks == 0) return Status::Ok();
    if (chunks == nullptr) return Status::InvalidArgument("chunks is NULL with n_chunks " + std::to_string(n_chunks));
    if (cached_tokens == nullptr) return Status::InvalidArgument("cached_tokens is NULL");
    if (tokens == nullptr) return Status::InvalidArgument("tokens is NULL");
    for (uint64_t i = 0; i < n_chunks; ++i) {
      const flatkv_chunk& c = chunks[i];
      if (c.length == 0 || c.begin > n_tokens || c.length > n_tokens - c.begin)
        return Status::InvalidArgument("chunk " + std::to_string(i) + " is tokens [" + std::to_string(c.begin) + ", " +
                                       std::to_string(c.begin) + " + " + std::to_string(c.length) +
                                       "), expected a non-empty range inside the prompt's " +
                                       std::to_string(n_tokens) + " tokens");
    }
    const uint32_t bt = store->geometry.block_tokens;
    std::vector<uint64_t> cached(n_chunks);  // written out only when every lookup succeeded
    for (uint64_t i = 0; i < n_chunks; ++i) {
      const auto keys = ChunkKeysOf(ns, tokens + chunks[i].begin, chunks[i].length, bt);
      FLATKV_ASSIGN_OR_RETURN(const uint32_t hit, store->backend->Match(keys));
      cached[i] = hit == keys.size() ? chunks[i].length : uint64_t{hit} * bt;
    }
    std::memcpy(cached_tokens, cached.data(), n_chunks * sizeof(uint64_t));
    return Status::Ok();
  });
}

flatkv_status* flatkv_store_restore_chunk(flatkv_store* store, const flatkv_namespace* ns, const uint32_t* tokens,
                                          uint64_t n_tokens, const flatkv_rope* rope, uint64_t pos0, void* dst,
                                          uint64_t dst_bytes, uint64_t* n_restored) {
  return Guard(__func__, [&]() -> Status {
    if (n_restored) *n_restored = 0;
    FLATKV_RETURN_IF_ERROR(CheckCommon(store, ns, tokens, n_tokens));
    if (n_restored == nullptr) return Status::InvalidArgument("n_restored is NULL");
    const Geometry& g = store->geometry;
    const RowGeometry r = RowsOf(g.shape);
    const uint64_t layer_bytes = n_tokens * r.token_layer_bytes(), need = uint64_t{g.layers} * layer_bytes;
    if (dst == nullptr) return Status::InvalidArgument("dst is NULL");
    if (dst_bytes < need)
      return Status::InvalidArgument("dst is " + std::to_string(dst_bytes) + " bytes, a chunk of " +
                                     std::to_string(n_tokens) + " tokens needs " + std::to_string(need));
    RopePlan plan;
    if (rope != nullptr) {
      FLATKV_ASSIGN_OR_RETURN(plan, PlanRope(*rope, g.shape, pos0, n_tokens));
    }
    const auto keys = ChunkKeysOf(ns, tokens, n_tokens, g.block_tokens);
    std::vector<std::byte> blocks(keys.size() * g.block_bytes);
    FLATKV_ASSIGN_OR_RETURN(const uint32_t valid,
                            store->backend->Restore(keys, blocks.data(), FLATKV_LAYOUT_BLOCK_MAJOR));
    const uint64_t count = valid == keys.size() ? n_tokens : uint64_t{valid} * g.block_tokens;
    auto* out = static_cast<std::byte*>(dst);
    for (uint32_t l = 0; l < g.layers; ++l) {
      for (uint32_t part = 0; part < r.parts; ++part)
        for (uint64_t t = 0; t < count; ++t)
          std::memcpy(out + l * layer_bytes + ChunkRow(r, n_tokens, part, t),
                      blocks.data() + (t / g.block_tokens) * g.block_bytes + l * g.block_layer_bytes +
                          SliceRow(r, g.block_tokens, part, t),
                      r.row_bytes);
      if (rope != nullptr && count > 0) RotateRows(out + l * layer_bytes, count, pos0, plan, g.shape.dtype);
    }
    *n_restored = count;
    return Status::Ok();
  });
}

}  // extern "C"
