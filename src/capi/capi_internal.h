// The C API's internals: the structs behind its opaque handles, the
// exception barrier every entry point runs in, and the Backend interface
// that the embedded store and the daemon client both implement.
//
// Every extern "C" function body runs inside Guard() (or is noexcept by
// construction), so no C++ exception crosses the boundary.
#pragma once

#include <cstdint>
#include <chrono>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <utility>

#include "flatkv/flatkv.h"
#include "flatkv/keys.h"
#include "flatkv/prune.h"
#include "flatkv/options.h"
#include "flatkv/placement.h"
#include "flatkv/shape.h"
#include "flatkv/stats.h"
#include "flatkv/status.h"
#include "flatkv/store.h"

struct flatkv_status {
  flatkv_code code;
  std::string message;
};

struct flatkv_options {
  flatkv::StoreOptions store;
  bool shape_set = false;
  // Daemon client: set by flatkv_options_set_server.
  std::string server;
  std::string token;
  uint64_t shm_window_bytes = 0;
  // flatkv_options_set_server_timeouts: one request's deadline, and connecting (hello included).
  uint32_t server_deadline_ms = 10000;
  uint32_t server_connect_timeout_ms = 5000;
};

struct flatkv_namespace {
  flatkv::KeyHasher hasher;
  flatkv::BlockKey digest;
};

namespace flatkv::capi {

// The geometry blocks are exchanged in.
struct Geometry {
  uint32_t layers = 0;
  uint32_t block_tokens = 0;
  uint64_t block_layer_bytes = 0;
  uint64_t block_bytes = 0;
  KvShape shape;  // what the bytes of a token's layer slice are (the chunk calls read it)
};

// A restore in flight, consumed in layer order (flatkv_restore_*).
// Used by one thread at a time.
class BackendRestore {
 public:
  virtual ~BackendRestore() = default;
  virtual uint32_t hit_blocks() = 0;
  // `data` is empty when the restore has a caller destination.
  virtual Result<LayerView> WaitLayer(uint32_t layer) = 0;
  virtual void ReleaseLayer(uint32_t layer) = 0;
  virtual Result<uint32_t> Finish() = 0;
};

// What a flatkv_store does: an embedded Store or a daemon Client. Arguments
// are checked by the entry points (non-null, sizes) before they get here.
// Thread-safe.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual const Geometry& geometry() const = 0;
  virtual Result<uint32_t> Match(std::span<const BlockKey> keys) = 0;
  virtual Status Put(uint64_t session, std::span<const BlockKey> keys, std::span<const std::byte> data,
                     PutHint hint) = 0;
  // `dst` (may be null) holds keys.size() blocks laid out by `layout`.
  virtual Result<std::unique_ptr<BackendRestore>> StartRestore(std::span<const BlockKey> keys, std::byte* dst,
                                                               flatkv_layout layout) = 0;
  // Restores the stored prefix of `keys` into `dst` and waits for it;
  // returns the blocks valid in every layer.
  virtual Result<uint32_t> Restore(std::span<const BlockKey> keys, std::byte* dst, flatkv_layout layout) = 0;
  virtual Status DropSession(uint64_t session) = 0;
  // Store::Prefetch: the leading blocks found; their DRAM copies come in
  // the background.
  virtual Result<uint32_t> Prefetch(std::span<const BlockKey> keys) = 0;
  // Store::TruncateSession and Store::Retain.
  virtual Result<uint32_t> TruncateSession(uint64_t session, uint32_t keep_blocks) = 0;
  virtual Result<uint32_t> Retain(std::span<const BlockKey> keys, std::chrono::milliseconds ttl) = 0;
  // Store::Prune (a daemon builds the view itself, protocol 6).
  virtual Result<PruneResult> Prune(std::span<const BlockKey> keys, std::span<const TokenRange> ranges, PutHint hint) = 0;
  virtual Result<StoreStats> Stats() = 0;
  virtual Result<std::string> StatsJson() = 0;
  // The store's options (StoreOptionsToJson; a daemon's, from its stats).
  virtual Result<std::string> OptionsJson() = 0;
  virtual Status Close() = 0;
};

Result<std::unique_ptr<Backend>> OpenEmbedded(const flatkv_options& options);
Result<std::unique_ptr<Backend>> ConnectRemote(const flatkv_options& options);

// Where block b's slice of layer l goes in a caller buffer of n blocks.
inline std::byte* Destination(std::byte* dst, flatkv_layout layout, const Geometry& g, uint64_t n, uint32_t layer,
                              uint32_t block) {
  if (layout == FLATKV_LAYOUT_LAYER_MAJOR) return dst + (uint64_t{layer} * n + block) * g.block_layer_bytes;
  return dst + uint64_t{block} * g.block_bytes + uint64_t{layer} * g.block_layer_bytes;
}

// The placement hint of flatkv_store_put's flags (at most one hint).
Result<PutHint> PutHintOf(uint32_t flags);

// Parses a daemon's or a store's stats JSON (StoreStats::ToJson's keys, at
// the top level or under "store").
Result<StoreStats> StatsFromJson(const std::string& json);
// The "options" object of a daemon's stats JSON, as JSON text.
Result<std::string> OptionsFromStatsJson(const std::string& json);

// A new error status; nullptr for OK. Never throws: when even the status
// cannot be allocated it returns the shared out-of-memory status.
flatkv_status* MakeStatus(const Status& status, const char* where) noexcept;
flatkv_status* OutOfMemoryStatus() noexcept;
flatkv_status* InternalErrorStatus(const char* where, const char* what) noexcept;

// Runs `f` (returning a Status) and turns its result, or any exception it
// throws, into a flatkv_status.
template <typename F>
flatkv_status* Guard(const char* where, F&& f) noexcept {
  try {
    return MakeStatus(f(), where);
  } catch (const std::bad_alloc&) {
    return OutOfMemoryStatus();
  } catch (const std::exception& e) {
    return InternalErrorStatus(where, e.what());
  } catch (...) {
    return InternalErrorStatus(where, "unknown exception");
  }
}

}  // namespace flatkv::capi

struct flatkv_store {
  std::shared_ptr<flatkv::capi::Backend> backend;
  flatkv::capi::Geometry geometry;
};

struct flatkv_restore {
  // Declared first so it is destroyed last: keeps the backend alive for the
  // restore even when the store handle is destroyed before it.
  std::shared_ptr<flatkv::capi::Backend> backend;
  std::unique_ptr<flatkv::capi::BackendRestore> restore;
};
