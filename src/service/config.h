// ServerConfig: what `flatkv serve` runs with. Built-in defaults, then a
// TOML file (docs/service.md lists every key), then command-line flags.
//
// Defaults: DRAM tier = 1/8 of the machine's memory; one SSD directory
// $XDG_CACHE_HOME/flatkv/store (else ~/.cache/flatkv/store) of at most
// 16 GiB or half the filesystem's free space, whichever is smaller; a Unix
// socket $XDG_RUNTIME_DIR/flatkv/flatkv.sock (else the cache directory's
// run/flatkv.sock), owner-only in a directory of mode 0700; TCP on
// 127.0.0.1:7471 only when tenants are configured; HTTP metrics on
// 127.0.0.1:7472 — loopback only unless listen.allow_remote is set (which
// needs TLS and tenants); the Llama-3.1-8B KV shape.
//
// Thread-safety: plain values.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "flatkv/options.h"
#include "flatkv/status.h"
#include "service/tenants.h"

namespace flatkv::service {

inline constexpr std::string_view kTcpAuto = "auto";

// server.loop_threads when the configuration names none: one loop below 4
// CPUs, as Redis answers every request on one thread, else two. On 2 CPUs
// shared with the clients a second loop is one more thread to be descheduled
// behind them, and its connections' requests wait a time slice: `bench
// serve --clients 64` measured lookup p99 1.6-2.8x Redis GET's with two loops
// and 0.93-1.03x with one (docs/benchmarks.md, "The daemon").
uint32_t DefaultLoopThreads();
inline constexpr std::string_view kDefaultTcpAddress = "127.0.0.1:7471";

struct ServerConfig {
  // The store: shape, ssd_dirs and every knob of StoreKnobs(), at the
  // store's own defaults unless set (0 = derived stays 0, for the store to
  // derive). Its capacities come from the fields below in FinalizeConfig.
  StoreOptions store;
  // DRAM tier bytes (0 disables it); unset: dram_fraction of physical memory.
  std::optional<uint64_t> dram_bytes;
  double dram_fraction = 0.125;  // in [0, 0.9]
  // SSD bytes per directory; unset: min(16 GiB, half the free space).
  std::optional<uint64_t> ssd_bytes;

  // Listening addresses; empty disables one. unix_path is a socket path;
  // tcp_address and http_address are "host:port" (port 0: any free port).
  // tcp_address kTcpAuto: kDefaultTcpAddress when tenants are configured,
  // off otherwise (FinalizeConfig resolves it). An explicit TCP address
  // needs at least one tenant: a TCP port is open to every local user.
  std::string unix_path;
  std::string tcp_address = std::string(kTcpAuto);
  std::string http_address = "127.0.0.1:7472";
  // Permit non-loopback TCP/HTTP addresses. Off by default; refused unless
  // TLS and tenants are configured too.
  bool allow_remote = false;

  // TLS for the TCP listener (both or neither).
  std::string tls_cert_file;
  std::string tls_key_file;

  // [server] Event-loop threads (each waits on its share of the connections
  // and answers small requests; DefaultLoopThreads()), and the worker threads
  // kept ready for requests that can block (more start while all are busy).
  uint32_t loop_threads = DefaultLoopThreads();
  uint32_t workers = 2;

  // Largest frame payload accepted or sent, bytes (a put is split by clients to fit).
  uint64_t max_frame_bytes = 64ull << 20;
  // Deadline of a request that names none.
  std::chrono::milliseconds default_deadline{10000};
  // The longest deadline a client may ask for (deadline_ms is capped to it).
  std::chrono::milliseconds max_deadline{60000};
  // How long a started frame may take to arrive, or a reply to drain, before
  // the connection is dropped (a stalled or slow client).
  std::chrono::milliseconds io_timeout{30000};
  // Connections beyond this are refused with an error frame.
  uint32_t max_connections = 1024;
  // A connection must complete its hello (and TLS handshake) within this;
  // short, so unauthenticated peers cannot hold threads for long.
  std::chrono::milliseconds login_timeout{2000};
  // Connections from one peer (TCP: its IP address; Unix: its uid) that
  // have not logged in yet; more are refused at accept.
  uint32_t max_unauthenticated_per_peer = 32;
  // Shared-memory windows per connection, and their total bytes; and the
  // bytes mapped for all connections together.
  uint32_t max_shm_windows = 16;
  uint64_t max_shm_bytes = 64ull << 30;
  uint64_t max_shm_total_bytes = 256ull << 30;
  // A restore pins its blocks' extents until it finishes: at most this long
  // (a slow reader is cut off: error frame if possible, then the connection
  // closes), and per tenant at most this many bytes of blocks in restores
  // at once (more: NoSpace). 0 bytes: no byte limit.
  std::chrono::milliseconds max_restore_time{30000};
  uint64_t tenant_pinned_bytes = 64ull << 30;
  // A retain keeps a chain from eviction for at most this long (a longer
  // ttl is cut to it); a tenant's unexpired retains share
  // tenant_pinned_bytes with its restores in flight (these come first).
  std::chrono::milliseconds max_retain{3600000};

  std::vector<TenantConfig> tenants;

  // [metrics]: what the HTTP endpoint reveals (docs/service.md, Observability).
  // Label per-tenant /metrics series with the tenant's name; off (default):
  // with its position in [[tenants]] ("0", "1", ...), so a scrape carries no names.
  bool metrics_tenant_labels = false;
  // The bearer token /stats requires (16+ characters); empty: /stats refuses
  // every request with 401. Not a tenant token: /stats shows every tenant.
  std::string stats_token;
};

// Built-in defaults (reads /proc/meminfo-equivalent sysconf and the environment).
ServerConfig DefaultServerConfig();
// Applies a TOML document over `config`. Unknown keys are errors naming them.
Status ApplyConfigToml(std::string_view text, const std::string& origin, ServerConfig* config);
Status LoadConfigFile(const std::string& path, ServerConfig* config);
// Fills derived values (DRAM from dram_fraction when dram_bytes was not set,
// SSD capacity bounded by free space, tcp_address from kTcpAuto) and checks
// the result: TCP only with tenants; loopback-only addresses unless
// allow_remote, which needs TLS and tenants; TLS files both or neither;
// limits in range. Each refusal says which setting to change.
Status FinalizeConfig(ServerConfig* config);

// "64MiB", "8GiB", "1.5G", "4096" -> bytes.
Result<uint64_t> ParseByteSize(std::string_view text);

// The [store] keys that set one StoreOptions field each, in the order of
// docs/service.md (block_tokens, segment_bytes, ..., ssd_admission, ...).
// `flatkv serve` has one flag per key (StoreKnobInfo::flag VALUE).
struct StoreKnobInfo {
  std::string_view key;   // TOML key, e.g. "session_dram_share_bytes"
  std::string_view help;  // one line, with the unit
  std::string flag;       // the `flatkv serve` flag: the key with dashes, e.g. "--session-dram-share-bytes"
};
std::vector<StoreKnobInfo> StoreKnobs();
// Sets the knob `key` from a command-line value: sizes as in ParseByteSize,
// counts and milliseconds as decimal integers, booleans true/false,
// enums by name. Errors name the flag and the value.
Status ApplyStoreKnobFlag(std::string_view key, std::string_view value, ServerConfig* config);
// The knob's current value in TOML syntax (what --print-config shows).
std::string StoreKnobValue(std::string_view key, const ServerConfig& config);

}  // namespace flatkv::service
