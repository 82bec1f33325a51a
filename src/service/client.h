// Client: a connection to a `flatkv serve` daemon (docs/service.md), over a
// Unix socket ("unix:/path/to.sock") or TCP ("tcp:host:port", optionally
// with TLS), speaking the wire protocol of docs/format_wire.md.
//
// The client sends the keys its engine computed (KeyHasher chains); the
// daemon salts them with the tenant's secret before touching the store, so
// a tenant only ever sees its own blocks. Payloads use the store's layout:
// a block is `layers` consecutive slices of block_layer_bytes each.
//
// Two restore paths:
//   - over the socket: the daemon streams each layer as the store delivers
//     it; the client places the slices where the caller says;
//   - through a shared-memory window (Unix socket only): the client creates
//     a memfd, maps it, and passes it to the daemon (SCM_RIGHTS); the daemon
//     restores straight into it, layer-major, and signals each layer.
//
// Thread-safety: all methods are thread-safe; requests on one Client are
// serialized (one in flight per connection). Use one Client per thread for
// parallelism. A Client that saw a transport error is broken: every later
// call fails with the same error (reconnect with Connect).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "flatkv/keys.h"
#include "flatkv/placement.h"
#include "flatkv/shape.h"
#include "flatkv/status.h"
#include "flatkv/store.h"

namespace flatkv::service {

struct ClientOptions {
  // The tenant's token, as written in the daemon's config. Empty is accepted
  // only by a daemon configured without tenants (its single "default" one).
  std::string token;
  // Per-request deadline, sent with every request; the daemon abandons a
  // request past it (Aborted). Also bounds how long the client waits for a
  // reply. Default 10 s.
  std::chrono::milliseconds deadline{10000};
  // Connecting and the hello exchange. Default 5 s.
  std::chrono::milliseconds connect_timeout{5000};
  // TLS on a tcp: address (the daemon must have [tls] configured).
  bool tls = false;
  // PEM file of CAs to verify the server with; empty: the system's default paths.
  std::string tls_ca_file;
  // Verify the server's certificate chain and name. Turn off only for tests.
  bool tls_verify = true;
  // Name to check the certificate against; empty: the host of the address.
  std::string tls_server_name;
  // Announced to the daemon (logs and metrics only).
  std::string client_name = "flatkv-client";
};

// What the daemon said in its hello reply.
struct ServerInfo {
  uint32_t protocol_version = 0;
  std::string tenant;
  KvShape shape;
  uint32_t block_tokens = 0;
  uint64_t block_layer_bytes = 0;  // one block's slice of one layer
  uint64_t block_bytes = 0;        // shape.layers * block_layer_bytes
  uint64_t max_frame_bytes = 0;    // largest frame either side may send
};

struct RestoreResult {
  uint32_t hit_blocks = 0;    // leading blocks found when the restore began
  uint32_t valid_blocks = 0;  // blocks valid in every layer (<= hit_blocks)
};

// Called once per layer, in layer order, as it arrives. `blocks` is how many
// leading blocks of this layer are valid (it can only shrink from layer to
// layer). Over the socket `data` is those blocks' slices, block-major,
// valid only during the call; on the shared-memory path `data` is the
// layer's region of the window. A non-OK return aborts the restore (the
// connection is then closed, since the rest of the stream is unread).
using LayerCallback = std::function<Status(uint32_t layer, uint32_t blocks, std::span<const std::byte> data)>;

// A shared-memory window registered with the daemon: a memfd mapped here and
// in the daemon. Restores into it are laid out layer-major from `offset`:
// block b of layer l of a chain of n keys is at
//   offset + (l * n + b) * block_layer_bytes.
// Owned by its Client; valid until the Client is destroyed.
struct ShmWindow {
  uint64_t id = 0;     // the daemon's handle for it
  std::byte* base = nullptr;
  uint64_t bytes = 0;
};

class Client {
 public:
  // Connects to "unix:PATH" or "tcp:HOST:PORT" and authenticates. Fails with
  // InvalidArgument on a malformed address, IoError when nothing listens,
  // PermissionDenied on a bad token, NotSupported on a protocol mismatch.
  static Result<std::unique_ptr<Client>> Connect(const std::string& address, const ClientOptions& options = {});
  virtual ~Client() = default;

  virtual const ServerInfo& info() const = 0;

  // How many leading keys of `chain` the tenant has stored (no data moves).
  virtual Result<uint32_t> Lookup(std::span<const BlockKey> chain) = 0;

  // Stores `keys.size()` blocks for `session` (a tenant-local id). `data` is
  // the blocks back to back, block_bytes each. Large puts are split into
  // frames below max_frame_bytes. Blocks already stored are skipped.
  // NoSpace when the tenant's quota cannot hold them. `first_block` is the
  // chain position of keys[0] (PutOptions::first_block; kNoPosition: the
  // session's puts go on from the last); sent to daemons of protocol 5 and
  // up, left out for older ones (they go on from the last).
  static constexpr uint32_t kNoPosition = 0xFFFFFFFFu;  // PutOptions::kUnknownBlock
  virtual Status Put(SessionId session, std::span<const BlockKey> keys, std::span<const std::byte> data,
                     PutHint hint = PutHint::kAuto, uint32_t first_block = kNoPosition) = 0;

  // Restores the longest stored prefix of `chain` over the socket into `out`,
  // in Put's layout (block-major, block_bytes per block); `out` must hold
  // chain.size() blocks. Bytes of blocks past valid_blocks are unspecified.
  virtual Result<RestoreResult> Restore(std::span<const BlockKey> chain, std::span<std::byte> out) = 0;
  // The same, handing each layer to `on_layer` as it arrives.
  virtual Result<RestoreResult> RestoreLayers(std::span<const BlockKey> chain, const LayerCallback& on_layer) = 0;

  // Creates a memfd of `bytes` (rounded up to 4 KiB), maps it, and registers
  // it with the daemon. Unix sockets only (NotSupported on TCP).
  virtual Result<ShmWindow> RegisterShmWindow(uint64_t bytes) = 0;
  // Restores the prefix of `chain` into `window` at `offset` (4 KiB aligned
  // for the SSD's direct reads; any offset works), layer-major as described
  // at ShmWindow. `on_layer` (optional) is called as each layer completes.
  virtual Result<RestoreResult> RestoreToShm(const ShmWindow& window, uint64_t offset, std::span<const BlockKey> chain,
                                             const LayerCallback& on_layer = {}) = 0;

  // Drops one of this tenant's sessions: its blocks leave the store unless
  // another live session references them (protocol 2; NotSupported, naming
  // the version, against a daemon that speaks only 1).
  virtual Status DropSession(SessionId session) = 0;
  // Starts bringing the chain's DRAM copies in (Store::Prefetch); returns
  // the leading blocks found without waiting for them. Needs protocol 3.
  virtual Result<uint32_t> Prefetch(std::span<const BlockKey> chain) = 0;
  // Store::Retain and Store::TruncateSession in the daemon (protocol 4):
  // the ttl is capped by the daemon's limits.max_retain_ms, and the blocks
  // retained by what the tenant's pin budget leaves.
  virtual Result<uint32_t> Retain(std::span<const BlockKey> chain, std::chrono::milliseconds ttl) = 0;
  virtual Result<uint32_t> TruncateSession(SessionId session, uint32_t keep_blocks) = 0;
  // Store::Prune in the daemon (protocol 6): the view is built there, put
  // in this tenant's session PruneResult::view_session (charged to its
  // quota); a lookup or restore of PruneViewKeys finds it.
  virtual Result<PruneResult> Prune(std::span<const BlockKey> chain, std::span<const TokenRange> ranges,
                                    PutHint hint = PutHint::kAuto) = 0;
  // The daemon's /stats JSON (store and this server's counters).
  virtual Result<std::string> StatsJson() = 0;
  // A round trip: OK when the daemon answers and its store is open.
  virtual Status Health() = 0;
  // True when this connection cannot serve another call: it broke, or the
  // daemon closed it (the socket reports a hang-up; seen without a round
  // trip). A pool checks it before reusing an idle connection, so the first
  // call after a daemon restart does not fail on the old one.
  virtual bool PeerClosed() = 0;
};

}  // namespace flatkv::service
