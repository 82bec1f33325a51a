// The chunk calls of the C API (include/flatkv/flatkv.h, "chunks";
// docs/blend.md): chunk keys, and chunk KV moved between the caller's chunk
// rows and the store's blocks, with keys re-rotated on the way out
// (model/chunk_kv.h: the layouts and rotation the reference engine uses).
// Built on the Backend's Match / Put / Restore, so an embedded store and a
// daemon client behave the same.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "capi/capi_internal.h"
#include "model/chunk_kv.h"

using flatkv::BlockKey;
using flatkv::KvShape;
using flatkv::Status;
using flatkv::capi::Geometry;
using flatkv::capi::Guard;
using flatkv::model::ChunkLayout;

namespace {

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

ChunkLayout LayoutOf(const Geometry& g) { return ChunkLayout(g.shape, g.block_tokens, g.block_layer_bytes); }

flatkv::Result<flatkv::model::ChunkRope> PlanRope(const flatkv_rope& rope, const KvShape& shape, uint64_t pos0,
                                                  uint64_t n) {
  flatkv::model::RopeSpec spec;
  if (rope.style == FLATKV_ROPE_INTERLEAVED)
    spec.style = flatkv::model::RopeStyle::kInterleaved;
  else if (rope.style == FLATKV_ROPE_NEOX)
    spec.style = flatkv::model::RopeStyle::kNeox;
  else
    return Status::InvalidArgument("unknown rope.style " + std::to_string(rope.style) +
                                   " (FLATKV_ROPE_INTERLEAVED=1, FLATKV_ROPE_NEOX=2)");
  spec.theta = rope.theta;
  spec.rotary_dim = rope.rotary_dim;
  return flatkv::model::PlanChunkRope(spec, shape, pos0, n);
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
  return store ? LayoutOf(store->geometry).token_layer_bytes() : 0;
}

flatkv_status* flatkv_store_put_chunk(flatkv_store* store, const flatkv_namespace* ns, const uint32_t* tokens,
                                      uint64_t n_tokens, const void* data, uint64_t data_bytes, uint32_t flags) {
  return Guard(__func__, [&]() -> Status {
    FLATKV_RETURN_IF_ERROR(CheckCommon(store, ns, tokens, n_tokens));
    const Geometry& g = store->geometry;
    const ChunkLayout layout = LayoutOf(g);
    const uint64_t need = layout.rows_bytes(n_tokens);
    if (data == nullptr) return Status::InvalidArgument("data is NULL");
    if (data_bytes != need)
      return Status::InvalidArgument("data is " + std::to_string(data_bytes) + " bytes, a chunk of " +
                                     std::to_string(n_tokens) + " tokens takes " + std::to_string(g.layers) +
                                     " layers x " + std::to_string(n_tokens) + " tokens x " +
                                     std::to_string(layout.token_layer_bytes()) + " bytes = " + std::to_string(need));
    FLATKV_ASSIGN_OR_RETURN(const flatkv::PutHint hint, flatkv::capi::PutHintOf(flags));
    const auto keys = ChunkKeysOf(ns, tokens, n_tokens, g.block_tokens);
    std::vector<std::byte> blocks(keys.size() * g.block_bytes);  // a partial block's tail stays zero
    layout.RowsToBlocks(static_cast<const std::byte*>(data), n_tokens, blocks.data());
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
    const ChunkLayout layout = LayoutOf(g);
    const uint64_t need = layout.rows_bytes(n_tokens);
    if (dst == nullptr) return Status::InvalidArgument("dst is NULL");
    if (dst_bytes < need)
      return Status::InvalidArgument("dst is " + std::to_string(dst_bytes) + " bytes, a chunk of " +
                                     std::to_string(n_tokens) + " tokens needs " + std::to_string(need));
    flatkv::model::ChunkRope plan;
    if (rope != nullptr) {
      FLATKV_ASSIGN_OR_RETURN(plan, PlanRope(*rope, g.shape, pos0, n_tokens));
    }
    const auto keys = ChunkKeysOf(ns, tokens, n_tokens, g.block_tokens);
    std::vector<std::byte> blocks(keys.size() * g.block_bytes);
    FLATKV_ASSIGN_OR_RETURN(const uint32_t valid,
                            store->backend->Restore(keys, blocks.data(), FLATKV_LAYOUT_BLOCK_MAJOR));
    const uint64_t count = valid == keys.size() ? n_tokens : uint64_t{valid} * g.block_tokens;
    auto* out = static_cast<std::byte*>(dst);
    layout.BlocksToRows(blocks.data(), n_tokens, count, out);
    if (rope != nullptr && count > 0) flatkv::model::RotateChunkKeys(out, layout, n_tokens, count, pos0, plan);
    *n_restored = count;
    return Status::Ok();
  });
}

}  // extern "C"
