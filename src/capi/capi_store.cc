// flatkv_store and flatkv_restore: argument checks, then the backend.
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "capi/capi_internal.h"

using flatkv::Status;
using flatkv::capi::Geometry;
using flatkv::capi::Guard;

namespace {

Status CheckStore(const flatkv_store* s) { return s ? Status::Ok() : Status::InvalidArgument("store is NULL"); }

// Copies C keys into BlockKeys, checking the pointer.
flatkv::Result<std::vector<flatkv::BlockKey>> Keys(const flatkv_key* keys, uint64_t n) {
  if (keys == nullptr && n > 0) return Status::InvalidArgument("keys is NULL with n_keys " + std::to_string(n));
  if (n > std::numeric_limits<uint32_t>::max())
    return Status::InvalidArgument("n_keys " + std::to_string(n) + " exceeds 2^32 - 1");
  std::vector<flatkv::BlockKey> out(n);
  for (uint64_t i = 0; i < n; ++i) out[i] = flatkv::BlockKey{keys[i].lo, keys[i].hi};
  return out;
}

// Checks a caller destination of `dst_bytes` for `n` blocks.
Status CheckDestination(const Geometry& g, uint64_t n, const void* dst, uint64_t dst_bytes, int32_t layout,
                        bool optional) {
  if (layout != FLATKV_LAYOUT_BLOCK_MAJOR && layout != FLATKV_LAYOUT_LAYER_MAJOR)
    return Status::InvalidArgument("unknown layout " + std::to_string(int(layout)) +
                                   " (FLATKV_LAYOUT_BLOCK_MAJOR=0, FLATKV_LAYOUT_LAYER_MAJOR=1)");
  if (dst == nullptr) {
    if (optional && dst_bytes == 0) return Status::Ok();
    return Status::InvalidArgument("dst is NULL with dst_bytes " + std::to_string(dst_bytes));
  }
  if (dst_bytes < n * g.block_bytes)
    return Status::InvalidArgument("dst is " + std::to_string(dst_bytes) + " bytes, " + std::to_string(n) +
                                   " blocks need " + std::to_string(n) + " x " + std::to_string(g.block_bytes));
  return Status::Ok();
}

// The put flags that are placement hints, one row each: dropping a hint is
// dropping its row (a flag no row names is an unknown flag).
constexpr struct {
  uint32_t flag;
  flatkv::PutHint hint;
} kPutHints[] = {
    {FLATKV_PUT_ONE_SHOT, flatkv::PutHint::kOneShot},
    {FLATKV_PUT_HOT, flatkv::PutHint::kHot},
};

flatkv::Result<flatkv::PutHint> HintOf(uint32_t flags) {
  uint32_t known = 0;
  for (const auto& row : kPutHints) known |= row.flag;
  if (flags & ~known) return Status::InvalidArgument("unknown put flags " + std::to_string(flags & ~known));
  flatkv::PutHint hint = flatkv::PutHint::kAuto;
  int hints = 0;
  for (const auto& row : kPutHints)
    if (flags & row.flag) hint = row.hint, ++hints;
  if (hints > 1)
    return Status::InvalidArgument("put flags " + std::to_string(flags) + " name " + std::to_string(hints) +
                                   " placement hints, at most one is allowed");
  return hint;
}

// Writes `json` with its NUL into `buf` under the *_json buffer convention.
Status CopyOut(const std::string& json, char* buf, uint64_t capacity, uint64_t* needed) {
  *needed = json.size() + 1;
  if (buf == nullptr && capacity == 0) return Status::Ok();
  if (buf == nullptr) return Status::InvalidArgument("buf is NULL with capacity " + std::to_string(capacity));
  if (capacity < *needed)
    return Status::InvalidArgument("buf holds " + std::to_string(capacity) + " bytes, the JSON needs " +
                                   std::to_string(*needed));
  std::memcpy(buf, json.c_str(), *needed);
  return Status::Ok();
}

}  // namespace

flatkv::Result<flatkv::PutHint> flatkv::capi::PutHintOf(uint32_t flags) { return HintOf(flags); }

extern "C" {

flatkv_status* flatkv_store_open(const flatkv_options* options, flatkv_store** out) {
  return Guard(__func__, [&]() -> Status {
    if (out == nullptr) return Status::InvalidArgument("out is NULL");
    *out = nullptr;
    if (options == nullptr) return Status::InvalidArgument("options is NULL");
    std::unique_ptr<flatkv::capi::Backend> backend;
    if (!options->server.empty()) {
      FLATKV_ASSIGN_OR_RETURN(backend, flatkv::capi::ConnectRemote(*options));
    } else {
      if (!options->shape_set)
        return Status::InvalidArgument(
            "no KV shape: call flatkv_options_set_shape_preset, _set_shape_mha or _set_shape_mla");
      FLATKV_ASSIGN_OR_RETURN(backend, flatkv::capi::OpenEmbedded(*options));
    }
    auto* store = new flatkv_store;
    store->geometry = backend->geometry();
    store->backend = std::move(backend);
    *out = store;
    return Status::Ok();
  });
}

flatkv_status* flatkv_store_close(flatkv_store* store) {
  return Guard(__func__, [&]() -> Status {
    FLATKV_RETURN_IF_ERROR(CheckStore(store));
    return store->backend->Close();
  });
}

void flatkv_store_destroy(flatkv_store* store) {
  if (store == nullptr) return;
  flatkv_status_destroy(flatkv_store_close(store));
  delete store;
}

uint32_t flatkv_store_layers(const flatkv_store* store) { return store ? store->geometry.layers : 0; }
uint32_t flatkv_store_block_tokens(const flatkv_store* store) { return store ? store->geometry.block_tokens : 0; }
uint64_t flatkv_store_block_layer_bytes(const flatkv_store* store) {
  return store ? store->geometry.block_layer_bytes : 0;
}
uint64_t flatkv_store_block_bytes(const flatkv_store* store) { return store ? store->geometry.block_bytes : 0; }
flatkv_dtype flatkv_store_dtype(const flatkv_store* store) {
  return store ? static_cast<flatkv_dtype>(store->geometry.shape.dtype) : static_cast<flatkv_dtype>(0);
}

flatkv_status* flatkv_store_match(flatkv_store* store, const flatkv_key* keys, uint64_t n_keys, uint32_t* n_hit) {
  return Guard(__func__, [&]() -> Status {
    if (n_hit) *n_hit = 0;
    FLATKV_RETURN_IF_ERROR(CheckStore(store));
    if (n_hit == nullptr) return Status::InvalidArgument("n_hit is NULL");
    FLATKV_ASSIGN_OR_RETURN(auto k, Keys(keys, n_keys));
    FLATKV_ASSIGN_OR_RETURN(*n_hit, store->backend->Match(k));
    return Status::Ok();
  });
}

flatkv_status* flatkv_store_put(flatkv_store* store, uint64_t session, const flatkv_key* keys, uint64_t n_keys,
                                const void* data, uint64_t data_bytes, uint32_t flags) {
  return Guard(__func__, [&]() -> Status {
    FLATKV_RETURN_IF_ERROR(CheckStore(store));
    FLATKV_ASSIGN_OR_RETURN(auto k, Keys(keys, n_keys));
    const uint64_t bb = store->geometry.block_bytes;
    if (data == nullptr && data_bytes > 0) return Status::InvalidArgument("data is NULL");
    if (data_bytes != n_keys * bb)
      return Status::InvalidArgument("data is " + std::to_string(data_bytes) + " bytes, expected " +
                                     std::to_string(n_keys) + " blocks x " + std::to_string(bb) + " bytes");
    FLATKV_ASSIGN_OR_RETURN(const flatkv::PutHint hint, HintOf(flags));
    return store->backend->Put(session, k, std::span(static_cast<const std::byte*>(data), data_bytes), hint);
  });
}

flatkv_status* flatkv_store_restore(flatkv_store* store, const flatkv_key* keys, uint64_t n_keys, void* dst,
                                    uint64_t dst_bytes, int32_t layout, uint32_t* n_restored) {
  return Guard(__func__, [&]() -> Status {
    if (n_restored) *n_restored = 0;
    FLATKV_RETURN_IF_ERROR(CheckStore(store));
    if (n_restored == nullptr) return Status::InvalidArgument("n_restored is NULL");
    FLATKV_ASSIGN_OR_RETURN(auto k, Keys(keys, n_keys));
    FLATKV_RETURN_IF_ERROR(CheckDestination(store->geometry, n_keys, dst, dst_bytes, layout, false));
    FLATKV_ASSIGN_OR_RETURN(*n_restored, store->backend->Restore(k, static_cast<std::byte*>(dst), static_cast<flatkv_layout>(layout)));
    return Status::Ok();
  });
}

flatkv_status* flatkv_store_restore_start(flatkv_store* store, const flatkv_key* keys, uint64_t n_keys, void* dst,
                                          uint64_t dst_bytes, int32_t layout, flatkv_restore** out) {
  return Guard(__func__, [&]() -> Status {
    if (out == nullptr) return Status::InvalidArgument("out is NULL");
    *out = nullptr;
    FLATKV_RETURN_IF_ERROR(CheckStore(store));
    FLATKV_ASSIGN_OR_RETURN(auto k, Keys(keys, n_keys));
    FLATKV_RETURN_IF_ERROR(CheckDestination(store->geometry, n_keys, dst, dst_bytes, layout, true));
    auto handle = std::make_unique<flatkv_restore>();
    handle->backend = store->backend;
    FLATKV_ASSIGN_OR_RETURN(handle->restore,
                            store->backend->StartRestore(k, static_cast<std::byte*>(dst), static_cast<flatkv_layout>(layout)));
    *out = handle.release();
    return Status::Ok();
  });
}

uint32_t flatkv_restore_hit_blocks(const flatkv_restore* restore) {
  if (restore == nullptr) return 0;
  try {
    return restore->restore->hit_blocks();
  } catch (...) {
    return 0;
  }
}

flatkv_status* flatkv_restore_wait_layer(flatkv_restore* restore, uint32_t layer, const void** data,
                                         uint32_t* blocks) {
  return Guard(__func__, [&]() -> Status {
    if (data) *data = nullptr;
    if (blocks) *blocks = 0;
    if (restore == nullptr) return Status::InvalidArgument("restore is NULL");
    if (blocks == nullptr) return Status::InvalidArgument("blocks is NULL");
    FLATKV_ASSIGN_OR_RETURN(auto view, restore->restore->WaitLayer(layer));
    *blocks = view.blocks;
    if (data && !view.data.empty()) *data = view.data.data();
    return Status::Ok();
  });
}

flatkv_status* flatkv_restore_release_layer(flatkv_restore* restore, uint32_t layer) {
  return Guard(__func__, [&]() -> Status {
    if (restore == nullptr) return Status::InvalidArgument("restore is NULL");
    const uint32_t layers = restore->backend->geometry().layers;
    if (layer >= layers)
      return Status::InvalidArgument("layer " + std::to_string(layer) + " of a " + std::to_string(layers) +
                                     "-layer model");
    restore->restore->ReleaseLayer(layer);
    return Status::Ok();
  });
}

flatkv_status* flatkv_restore_finish(flatkv_restore* restore, uint32_t* n_valid) {
  return Guard(__func__, [&]() -> Status {
    if (n_valid) *n_valid = 0;
    if (restore == nullptr) return Status::InvalidArgument("restore is NULL");
    if (n_valid == nullptr) return Status::InvalidArgument("n_valid is NULL");
    FLATKV_ASSIGN_OR_RETURN(*n_valid, restore->restore->Finish());
    return Status::Ok();
  });
}

void flatkv_restore_destroy(flatkv_restore* restore) {
  try {
    delete restore;
  } catch (...) {
  }
}

flatkv_status* flatkv_store_prefetch(flatkv_store* store, const flatkv_key* keys, uint64_t n_keys, uint32_t* n_found) {
  return Guard(__func__, [&]() -> Status {
    if (n_found) *n_found = 0;
    FLATKV_RETURN_IF_ERROR(CheckStore(store));
    if (n_found == nullptr) return Status::InvalidArgument("n_found is NULL");
    FLATKV_ASSIGN_OR_RETURN(auto k, Keys(keys, n_keys));
    FLATKV_ASSIGN_OR_RETURN(*n_found, store->backend->Prefetch(k));
    return Status::Ok();
  });
}

flatkv_status* flatkv_store_truncate_session(flatkv_store* store, uint64_t session, uint32_t keep_blocks,
                                             uint32_t* n_released) {
  return Guard(__func__, [&]() -> Status {
    if (n_released) *n_released = 0;
    FLATKV_RETURN_IF_ERROR(CheckStore(store));
    FLATKV_ASSIGN_OR_RETURN(uint32_t released, store->backend->TruncateSession(session, keep_blocks));
    if (n_released) *n_released = released;
    return Status::Ok();
  });
}

flatkv_status* flatkv_store_retain(flatkv_store* store, const flatkv_key* keys, uint64_t n_keys, uint32_t ttl_ms,
                                   uint32_t* n_retained) {
  return Guard(__func__, [&]() -> Status {
    if (n_retained) *n_retained = 0;
    FLATKV_RETURN_IF_ERROR(CheckStore(store));
    if (n_retained == nullptr) return Status::InvalidArgument("n_retained is NULL");
    FLATKV_ASSIGN_OR_RETURN(auto k, Keys(keys, n_keys));
    FLATKV_ASSIGN_OR_RETURN(*n_retained, store->backend->Retain(k, std::chrono::milliseconds(ttl_ms)));
    return Status::Ok();
  });
}

flatkv_status* flatkv_store_drop_session(flatkv_store* store, uint64_t session) {
  return Guard(__func__, [&]() -> Status {
    FLATKV_RETURN_IF_ERROR(CheckStore(store));
    return store->backend->DropSession(session);
  });
}

flatkv_status* flatkv_store_stats(flatkv_store* store, flatkv_stats* out) {
  return Guard(__func__, [&]() -> Status {
    FLATKV_RETURN_IF_ERROR(CheckStore(store));
    if (out == nullptr) return Status::InvalidArgument("out is NULL");
    std::memset(out, 0, sizeof(*out));
    FLATKV_ASSIGN_OR_RETURN(auto s, store->backend->Stats());
    auto medium = [](const flatkv::MediumStats& m) {
      return flatkv_medium_stats{m.capacity_bytes, m.used_bytes,    m.blocks,          m.hit_blocks,
                                 m.bytes_written,  m.bytes_read,    m.bytes_delivered, m.evicted_blocks};
    };
    out->dram = medium(s.dram);
    out->ssd = medium(s.ssd);
    out->sessions = s.sessions;
    out->restores = s.restores;
    out->lookup_blocks = s.lookup_blocks;
    out->miss_blocks = s.miss_blocks;
    out->put_blocks = s.put_blocks;
    out->dedup_blocks = s.dedup_blocks;
    out->checksum_failures = s.checksum_failures;
    out->io_errors = s.io_errors;
    out->recovered_blocks = s.recovered_blocks;
    out->lost_blocks = s.lost_blocks;
    out->restore_p50_us = s.restore_p50_us;
    out->restore_p99_us = s.restore_p99_us;
    return Status::Ok();
  });
}

flatkv_status* flatkv_store_stats_json(flatkv_store* store, char* buf, uint64_t capacity, uint64_t* needed) {
  return Guard(__func__, [&]() -> Status {
    if (needed) *needed = 0;
    FLATKV_RETURN_IF_ERROR(CheckStore(store));
    if (needed == nullptr) return Status::InvalidArgument("needed is NULL");
    FLATKV_ASSIGN_OR_RETURN(auto json, store->backend->StatsJson());
    return CopyOut(json, buf, capacity, needed);
  });
}

flatkv_status* flatkv_store_options_json(flatkv_store* store, char* buf, uint64_t capacity, uint64_t* needed) {
  return Guard(__func__, [&]() -> Status {
    if (needed) *needed = 0;
    FLATKV_RETURN_IF_ERROR(CheckStore(store));
    if (needed == nullptr) return Status::InvalidArgument("needed is NULL");
    FLATKV_ASSIGN_OR_RETURN(auto json, store->backend->OptionsJson());
    return CopyOut(json, buf, capacity, needed);
  });
}

}  // extern "C"
