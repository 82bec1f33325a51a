// flatkv_options and flatkv_namespace: what a store is opened with, and
// key hashing.
#include <chrono>
#include <cstdint>
#include <new>
#include <string>
#include <vector>

#include "capi/capi_internal.h"
#include "flatkv/shape.h"

using flatkv::Status;
using flatkv::capi::Guard;

namespace {

Status CheckOptions(const flatkv_options* o) {
  return o ? Status::Ok() : Status::InvalidArgument("options is NULL");
}

flatkv::Result<flatkv::DType> ToDType(int32_t dtype) {
  switch (dtype) {
    case FLATKV_DTYPE_F16: return flatkv::DType::kF16;
    case FLATKV_DTYPE_BF16: return flatkv::DType::kBF16;
    case FLATKV_DTYPE_F32: return flatkv::DType::kF32;
    case FLATKV_DTYPE_FP8_E4M3: return flatkv::DType::kF8E4M3;
    case FLATKV_DTYPE_FP8_E5M2: return flatkv::DType::kF8E5M2;
  }
  return Status::InvalidArgument("unknown dtype " + std::to_string(int(dtype)) +
                                 " (FLATKV_DTYPE_F16=1, BF16=2, F32=3, FP8_E4M3=4, FP8_E5M2=5)");
}

// One row per C constant of an enumerated option: dropping a value is
// dropping its row.
template <typename E>
struct EnumValue {
  int32_t c;
  const char* c_name;
  E value;
};
constexpr EnumValue<flatkv::SsdAdmission> kSsdAdmissions[] = {
    {FLATKV_SSD_ADMISSION_ALL, "FLATKV_SSD_ADMISSION_ALL", flatkv::SsdAdmission::kAll},
    {FLATKV_SSD_ADMISSION_ON_REUSE, "FLATKV_SSD_ADMISSION_ON_REUSE", flatkv::SsdAdmission::kOnReuse},
};
constexpr EnumValue<flatkv::IoEngineKind> kIoEngines[] = {
    {FLATKV_IO_AUTO, "FLATKV_IO_AUTO", flatkv::IoEngineKind::kAuto},
    {FLATKV_IO_URING, "FLATKV_IO_URING", flatkv::IoEngineKind::kUring},
    {FLATKV_IO_THREAD_POOL, "FLATKV_IO_THREAD_POOL", flatkv::IoEngineKind::kThreadPool},
};

// The value of C constant `c`, or "unknown <what> 7 (A=0, B=1)".
template <typename E, size_t N>
flatkv::Result<E> FromC(const EnumValue<E> (&table)[N], int32_t c, const char* what) {
  std::string known;
  for (const auto& row : table) {
    if (row.c == c) return row.value;
    known += (known.empty() ? "" : ", ") + std::string(row.c_name) + "=" + std::to_string(row.c);
  }
  return Status::InvalidArgument("unknown " + std::string(what) + " " + std::to_string(int(c)) + " (" + known + ")");
}

// "<name> is 0, expected > 0" for counts that must be positive.
Status CheckPositive(uint64_t v, const char* name) {
  if (v == 0) return Status::InvalidArgument(std::string(name) + " is 0, expected > 0");
  return Status::Ok();
}

// Runs `set` on the options after the NULL check, inside the exception barrier.
template <typename F>
flatkv_status* SetOption(const char* where, flatkv_options* o, F&& set) {
  return Guard(where, [&]() -> Status {
    FLATKV_RETURN_IF_ERROR(CheckOptions(o));
    return set(o->store);
  });
}

// A setter that stores `value` in `field` as it is.
template <typename T>
flatkv_status* SetField(const char* where, flatkv_options* o, T flatkv::StoreOptions::*field, T value) {
  return SetOption(where, o, [&](flatkv::StoreOptions& s) {
    s.*field = value;
    return Status::Ok();
  });
}

// A setter of a count or size that must be > 0 ("<name> is 0, expected > 0").
template <typename T>
flatkv_status* SetPositive(const char* where, flatkv_options* o, T flatkv::StoreOptions::*field, T value,
                           const char* name) {
  return SetOption(where, o, [&](flatkv::StoreOptions& s) -> Status {
    FLATKV_RETURN_IF_ERROR(CheckPositive(value, name));
    s.*field = value;
    return Status::Ok();
  });
}

Status SetShape(flatkv_options* o, const flatkv::KvShape& shape) {
  FLATKV_RETURN_IF_ERROR(shape.Validate());
  o->store.shape = shape;
  o->shape_set = true;
  return Status::Ok();
}

}  // namespace

extern "C" {

flatkv_options* flatkv_options_create(void) {
  try {
    return new flatkv_options;
  } catch (...) {
    return nullptr;
  }
}

void flatkv_options_destroy(flatkv_options* options) { delete options; }

flatkv_status* flatkv_options_set_shape_preset(flatkv_options* options, const char* name) {
  return Guard(__func__, [&]() -> Status {
    FLATKV_RETURN_IF_ERROR(CheckOptions(options));
    if (name == nullptr) return Status::InvalidArgument("preset name is NULL");
    FLATKV_ASSIGN_OR_RETURN(auto shape, flatkv::FindShapePreset(name));
    return SetShape(options, shape);
  });
}

flatkv_status* flatkv_options_set_shape_mha(flatkv_options* options, uint32_t layers, uint32_t kv_heads,
                                            uint32_t head_dim, int32_t dtype) {
  return Guard(__func__, [&]() -> Status {
    FLATKV_RETURN_IF_ERROR(CheckOptions(options));
    FLATKV_ASSIGN_OR_RETURN(auto t, ToDType(dtype));
    return SetShape(options, flatkv::KvShape::Mha(layers, kv_heads, head_dim, t));
  });
}

flatkv_status* flatkv_options_set_shape_mla(flatkv_options* options, uint32_t layers, uint32_t latent_dim,
                                            uint32_t rope_dim, int32_t dtype) {
  return Guard(__func__, [&]() -> Status {
    FLATKV_RETURN_IF_ERROR(CheckOptions(options));
    FLATKV_ASSIGN_OR_RETURN(auto t, ToDType(dtype));
    return SetShape(options, flatkv::KvShape::Mla(layers, latent_dim, rope_dim, t));
  });
}

flatkv_status* flatkv_options_set_block_tokens(flatkv_options* options, uint32_t block_tokens) {
  return Guard(__func__, [&]() -> Status {
    FLATKV_RETURN_IF_ERROR(CheckOptions(options));
    if (block_tokens < 16 || block_tokens > 512)
      return Status::InvalidArgument("block_tokens " + std::to_string(block_tokens) + " is outside 16..512");
    options->store.block_tokens = block_tokens;
    return Status::Ok();
  });
}

flatkv_status* flatkv_options_set_dram_capacity(flatkv_options* options, uint64_t bytes) {
  return SetField(__func__, options, &flatkv::StoreOptions::dram_capacity_bytes, bytes);
}

flatkv_status* flatkv_options_add_ssd_dir(flatkv_options* options, const char* dir, uint64_t capacity_bytes) {
  return Guard(__func__, [&]() -> Status {
    FLATKV_RETURN_IF_ERROR(CheckOptions(options));
    if (dir == nullptr || *dir == '\0') return Status::InvalidArgument("SSD directory is NULL or empty");
    if (capacity_bytes == 0) return Status::InvalidArgument(std::string("SSD capacity of ") + dir + " is 0 bytes");
    options->store.ssd_dirs.emplace_back(dir);
    options->store.ssd_capacity_bytes = capacity_bytes;
    return Status::Ok();
  });
}

flatkv_status* flatkv_options_set_segment_bytes(flatkv_options* options, uint64_t bytes) {
  return Guard(__func__, [&]() -> Status {
    FLATKV_RETURN_IF_ERROR(CheckOptions(options));
    if (bytes == 0) return Status::InvalidArgument("segment size is 0 bytes");
    options->store.segment_bytes = bytes;
    return Status::Ok();
  });
}

flatkv_status* flatkv_options_set_extent_layer_bytes(flatkv_options* options, uint64_t dram_bytes,
                                                     uint64_t ssd_bytes) {
  return Guard(__func__, [&]() -> Status {
    FLATKV_RETURN_IF_ERROR(CheckOptions(options));
    if (dram_bytes == 0 || ssd_bytes == 0)
      return Status::InvalidArgument("extent layer bytes must be > 0, got dram " + std::to_string(dram_bytes) +
                                     " ssd " + std::to_string(ssd_bytes));
    options->store.dram_extent_layer_bytes = dram_bytes;
    options->store.ssd_extent_layer_bytes = ssd_bytes;
    return Status::Ok();
  });
}

flatkv_status* flatkv_options_set_dram_extent_layer_bytes(flatkv_options* options, uint64_t bytes) {
  return SetPositive(__func__, options, &flatkv::StoreOptions::dram_extent_layer_bytes, bytes, "dram_extent_layer_bytes");
}

flatkv_status* flatkv_options_set_ssd_extent_layer_bytes(flatkv_options* options, uint64_t bytes) {
  return SetPositive(__func__, options, &flatkv::StoreOptions::ssd_extent_layer_bytes, bytes, "ssd_extent_layer_bytes");
}

flatkv_status* flatkv_options_set_direct_io(flatkv_options* options, int32_t enable) {
  return SetField(__func__, options, &flatkv::StoreOptions::use_direct_io, enable != 0);
}

flatkv_status* flatkv_options_set_sync_writes(flatkv_options* options, int32_t enable) {
  return SetField(__func__, options, &flatkv::StoreOptions::sync_writes, enable != 0);
}

flatkv_status* flatkv_options_set_verify_dram_reads(flatkv_options* options, int32_t enable) {
  return SetField(__func__, options, &flatkv::StoreOptions::verify_dram_reads, enable != 0);
}

flatkv_status* flatkv_options_set_session_dram_share(flatkv_options* options, uint64_t bytes) {
  // 0: derived at Open
  return SetField(__func__, options, &flatkv::StoreOptions::session_dram_share_bytes, bytes);
}

flatkv_status* flatkv_options_set_dram_idle_after_ms(flatkv_options* options, uint64_t ms) {
  return SetOption(__func__, options, [&](flatkv::StoreOptions& o) {
    if (ms > uint64_t{INT64_MAX})
      return Status::InvalidArgument("dram_idle_after_ms " + std::to_string(ms) + " exceeds 2^63 - 1");
    o.dram_idle_after = std::chrono::milliseconds(static_cast<int64_t>(ms));
    return Status::Ok();
  });
}

flatkv_status* flatkv_options_set_ssd_admission(flatkv_options* options, int32_t admission) {
  return SetOption(__func__, options, [&](flatkv::StoreOptions& o) -> Status {
    FLATKV_ASSIGN_OR_RETURN(o.ssd_admission, FromC(kSsdAdmissions, admission, "ssd admission"));
    return Status::Ok();
  });
}

flatkv_status* flatkv_options_set_sized_extents(flatkv_options* options, int32_t enable) {
  return SetField(__func__, options, &flatkv::StoreOptions::sized_extents, enable != 0);
}

flatkv_status* flatkv_options_set_readmit_on_restore(flatkv_options* options, int32_t enable) {
  return SetField(__func__, options, &flatkv::StoreOptions::readmit_on_restore, enable != 0);
}

flatkv_status* flatkv_options_set_ssd_write_buffer(flatkv_options* options, uint64_t bytes) {
  // 0: derived at Open
  return SetField(__func__, options, &flatkv::StoreOptions::ssd_write_buffer_bytes, bytes);
}

flatkv_status* flatkv_options_set_manifest_checkpoint(flatkv_options* options, uint64_t bytes) {
  // 0: checkpoints only at close
  return SetField(__func__, options, &flatkv::StoreOptions::manifest_checkpoint_bytes, bytes);
}

flatkv_status* flatkv_options_set_window_layers(flatkv_options* options, uint32_t layers) {
  return SetPositive(__func__, options, &flatkv::StoreOptions::window_layers, layers, "window_layers");
}

flatkv_status* flatkv_options_set_window_bytes(flatkv_options* options, uint64_t bytes) {
  return SetField(__func__, options, &flatkv::StoreOptions::window_bytes, bytes);
}

flatkv_status* flatkv_options_set_ssd_layers_in_flight(flatkv_options* options, uint32_t layers) {
  return SetPositive(__func__, options, &flatkv::StoreOptions::ssd_layers_in_flight, layers, "ssd_layers_in_flight");
}

flatkv_status* flatkv_options_set_max_request_bytes(flatkv_options* options, uint64_t bytes) {
  return SetPositive(__func__, options, &flatkv::StoreOptions::max_request_bytes, bytes, "max_request_bytes");
}

flatkv_status* flatkv_options_set_ssd_io(flatkv_options* options, int32_t engine) {
  return SetOption(__func__, options, [&](flatkv::StoreOptions& o) -> Status {
    FLATKV_ASSIGN_OR_RETURN(o.ssd_io, FromC(kIoEngines, engine, "I/O engine"));
    return Status::Ok();
  });
}

flatkv_status* flatkv_options_set_ssd_queue_depth(flatkv_options* options, uint32_t depth) {
  return SetPositive(__func__, options, &flatkv::StoreOptions::ssd_queue_depth, depth, "ssd_queue_depth");
}

flatkv_status* flatkv_options_set_ssd_threads(flatkv_options* options, uint32_t threads) {
  return SetPositive(__func__, options, &flatkv::StoreOptions::ssd_threads, threads, "ssd_threads");
}

flatkv_status* flatkv_options_set_dram_threads(flatkv_options* options, uint32_t threads) {
  return SetPositive(__func__, options, &flatkv::StoreOptions::dram_threads, threads, "dram_threads");
}

flatkv_status* flatkv_options_set_decode_threads(flatkv_options* options, uint32_t threads) {
  return SetPositive(__func__, options, &flatkv::StoreOptions::decode_threads, threads, "decode_threads");
}

// The remote tier (StoreOptions::remote, docs/remote.md).
flatkv_status* flatkv_options_add_remote_seed(flatkv_options* options, const char* host_port) {
  return Guard(__func__, [&]() -> Status {
    FLATKV_RETURN_IF_ERROR(CheckOptions(options));
    const std::string a = host_port ? host_port : "";
    const size_t colon = a.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == a.size())
      return Status::InvalidArgument("remote seed \"" + a + "\" is not host:port");
    options->store.remote.seeds.push_back(a);
    return Status::Ok();
  });
}

flatkv_status* flatkv_options_set_remote_auth(flatkv_options* options, const char* user, const char* password) {
  return SetOption(__func__, options, [&](flatkv::StoreOptions& s) {
    s.remote.user = user ? user : "";
    s.remote.password = password ? password : "";
    return Status::Ok();
  });
}

flatkv_status* flatkv_options_set_remote_tls(flatkv_options* options, int32_t enable, const char* ca_file,
                                             int32_t verify) {
  return SetOption(__func__, options, [&](flatkv::StoreOptions& s) {
    s.remote.tls = enable != 0;
    s.remote.tls_ca_file = ca_file ? ca_file : "";
    s.remote.tls_verify = verify != 0;
    return Status::Ok();
  });
}

flatkv_status* flatkv_options_set_remote_prefix(flatkv_options* options, const char* prefix) {
  return SetOption(__func__, options, [&](flatkv::StoreOptions& s) -> Status {
    const std::string p = prefix ? prefix : "";
    if (p.empty() || p.find_first_of("{}: ") != std::string::npos)
      return Status::InvalidArgument("remote prefix \"" + p + "\" must be non-empty without '{', '}', ':' or spaces");
    s.remote.prefix = p;
    return Status::Ok();
  });
}

flatkv_status* flatkv_options_set_remote_timeout_ms(flatkv_options* options, uint32_t ms) {
  return SetOption(__func__, options, [&](flatkv::StoreOptions& s) -> Status {
    FLATKV_RETURN_IF_ERROR(CheckPositive(ms, "remote timeout_ms"));
    s.remote.timeout = std::chrono::milliseconds(ms);
    return Status::Ok();
  });
}

flatkv_status* flatkv_options_set_remote_capacity(flatkv_options* options, uint64_t bytes) {
  return SetOption(__func__, options, [&](flatkv::StoreOptions& s) {
    s.remote.capacity_bytes = bytes;
    return Status::Ok();
  });
}

flatkv_status* flatkv_options_set_remote_publish_buffer(flatkv_options* options, uint64_t bytes) {
  return SetOption(__func__, options, [&](flatkv::StoreOptions& s) {
    s.remote.publish_buffer_bytes = bytes;
    return Status::Ok();
  });
}

flatkv_status* flatkv_options_set_server(flatkv_options* options, const char* address, const char* tenant_token) {
  return Guard(__func__, [&]() -> Status {
    FLATKV_RETURN_IF_ERROR(CheckOptions(options));
    if (address == nullptr || *address == '\0') return Status::InvalidArgument("server address is NULL or empty");
    const std::string a(address);
    if (a.rfind("unix:", 0) != 0 && a.rfind("tcp:", 0) != 0)
      return Status::InvalidArgument("server address \"" + a + "\" is neither unix:/path nor tcp:host:port");
    options->server = a;
    options->token = tenant_token ? tenant_token : "";
    return Status::Ok();
  });
}

flatkv_status* flatkv_options_set_server_timeouts(flatkv_options* options, uint32_t deadline_ms,
                                                  uint32_t connect_timeout_ms) {
  return Guard(__func__, [&]() -> Status {
    FLATKV_RETURN_IF_ERROR(CheckOptions(options));
    FLATKV_RETURN_IF_ERROR(CheckPositive(deadline_ms, "server deadline_ms"));
    FLATKV_RETURN_IF_ERROR(CheckPositive(connect_timeout_ms, "server connect_timeout_ms"));
    options->server_deadline_ms = deadline_ms;
    options->server_connect_timeout_ms = connect_timeout_ms;
    return Status::Ok();
  });
}

flatkv_status* flatkv_options_set_shm_window(flatkv_options* options, uint64_t bytes) {
  return Guard(__func__, [&]() -> Status {
    FLATKV_RETURN_IF_ERROR(CheckOptions(options));
    options->shm_window_bytes = bytes;
    return Status::Ok();
  });
}

flatkv_status* flatkv_namespace_create(int32_t kind, uint64_t seed, const char* model_fingerprint,
                                       const char* adapter_id, const char* tenant_salt, flatkv_namespace** out) {
  return Guard(__func__, [&]() -> Status {
    if (out == nullptr) return Status::InvalidArgument("out is NULL");
    *out = nullptr;
    if (kind != FLATKV_HASH_XXH3 && kind != FLATKV_HASH_SHA256)
      return Status::InvalidArgument("unknown hash kind " + std::to_string(int(kind)) +
                                     " (FLATKV_HASH_XXH3=1, FLATKV_HASH_SHA256=2)");
    flatkv::KeyHasher hasher(static_cast<flatkv::HashKind>(kind), seed);
    flatkv::Namespace ns{model_fingerprint ? model_fingerprint : "", adapter_id ? adapter_id : "",
                         tenant_salt ? tenant_salt : ""};
    *out = new flatkv_namespace{hasher, hasher.NamespaceDigest(ns)};
    return Status::Ok();
  });
}

void flatkv_namespace_destroy(flatkv_namespace* ns) { delete ns; }

flatkv_key flatkv_namespace_digest(const flatkv_namespace* ns) {
  if (ns == nullptr) return flatkv_key{0, 0};
  return flatkv_key{ns->digest.lo, ns->digest.hi};
}

flatkv_status* flatkv_namespace_keys(const flatkv_namespace* ns, const flatkv_key* parent, const uint32_t* tokens,
                                     uint64_t n_tokens, uint32_t block_tokens, flatkv_key* keys,
                                     uint64_t keys_capacity, uint64_t* n_keys) {
  return Guard(__func__, [&]() -> Status {
    if (n_keys) *n_keys = 0;
    if (ns == nullptr) return Status::InvalidArgument("namespace is NULL");
    if (n_keys == nullptr) return Status::InvalidArgument("n_keys is NULL");
    if (tokens == nullptr && n_tokens > 0)
      return Status::InvalidArgument("tokens is NULL with n_tokens " + std::to_string(n_tokens));
    if (block_tokens == 0) return Status::InvalidArgument("block_tokens is 0");
    const uint64_t n = n_tokens / block_tokens;
    if (n > keys_capacity)
      return Status::InvalidArgument(std::to_string(n_tokens) + " tokens make " + std::to_string(n) +
                                     " blocks of " + std::to_string(block_tokens) + ", keys holds " +
                                     std::to_string(keys_capacity));
    if (keys == nullptr && n > 0) return Status::InvalidArgument("keys is NULL");
    flatkv::BlockKey key = parent ? flatkv::BlockKey{parent->lo, parent->hi} : ns->digest;
    for (uint64_t b = 0; b < n; ++b) {
      key = ns->hasher.Chain(key, std::span<const uint32_t>(tokens + b * block_tokens, block_tokens));
      keys[b] = flatkv_key{key.lo, key.hi};
    }
    *n_keys = n;
    return Status::Ok();
  });
}

flatkv_status* flatkv_namespace_engine_keys(const flatkv_namespace* ns, const uint8_t* hashes, uint64_t n_hashes,
                                            uint32_t hash_bytes, flatkv_key* keys, uint64_t keys_capacity) {
  return Guard(__func__, [&]() -> Status {
    if (ns == nullptr) return Status::InvalidArgument("namespace is NULL");
    if (hash_bytes == 0 || hash_bytes > 4096)
      return Status::InvalidArgument("hash_bytes is " + std::to_string(hash_bytes) + ", not 1..4096");
    if (n_hashes > keys_capacity)
      return Status::InvalidArgument(std::to_string(n_hashes) + " engine hashes, keys holds " +
                                     std::to_string(keys_capacity));
    if (n_hashes == 0) return Status::Ok();
    if (hashes == nullptr) return Status::InvalidArgument("hashes is NULL with n_hashes " + std::to_string(n_hashes));
    if (keys == nullptr) return Status::InvalidArgument("keys is NULL");
    const auto k = ns->hasher.EngineKeys(ns->digest, std::span<const uint8_t>(hashes, n_hashes * hash_bytes),
                                         hash_bytes);
    for (uint64_t b = 0; b < n_hashes; ++b) keys[b] = flatkv_key{k[b].lo, k[b].hi};
    return Status::Ok();
  });
}

}  // extern "C"
