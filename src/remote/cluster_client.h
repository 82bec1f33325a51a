// A Redis Cluster client for the remote tier (issue 15): keys routed to
// their hash slot's master (CRC16 mod 16384, hash tags honoured), the slot
// map read with CLUSTER SLOTS and refreshed on MOVED and after connection
// failures, ASK followed with ASKING, TRYAGAIN/CLUSTERDOWN/LOADING retried,
// per-request timeouts, AUTH (ACL users), TLS. Pipelines send each node its
// commands in one write and read the replies in order, all nodes at once.
//
// Retries: a command is re-sent after a connection failure until
// `retry_for` has passed (a failover promotes a replica within about
// cluster-node-timeout plus a second or two), so only idempotent commands
// belong here; the remote tier's objects are immutable (SET of a unique
// name to the same bytes).
//
// Thread-safety: one thread at a time; the remote tier gives each of its
// workers its own client.
#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "flatkv/status.h"
#include "remote/resp.h"

namespace flatkv::remote {

inline constexpr uint32_t kClusterSlots = 16384;

// CRC16-CCITT (XMODEM), the Redis Cluster key hash: Crc16("123456789") == 0x31C3.
uint16_t Crc16(std::string_view bytes);
// The key's slot: of the part between the first '{' and the next '}' when
// that is non-empty (a hash tag), else of the whole key.
uint16_t KeySlot(std::string_view key);

struct ClusterOptions {
  std::vector<std::string> seeds;  // "host:port"; at least one must answer
  std::string user;                // ACL user; empty: `default`
  std::string password;            // AUTH when non-empty
  bool tls = false;
  std::string tls_ca_file;         // empty: the system's CAs
  bool tls_verify = true;
  std::chrono::milliseconds timeout{1000};    // one request (send and reply)
  std::chrono::milliseconds retry_for{5000};  // re-sending through failovers and refreshes
  uint32_t max_redirects = 16;                // MOVED/ASK hops for one command
};

struct ClusterStats {
  uint64_t moved = 0, ask = 0, refreshes = 0, reconnects = 0, retries = 0;
};

class ClusterClient {
 public:
  ~ClusterClient();
  ClusterClient(const ClusterClient&) = delete;
  ClusterClient& operator=(const ClusterClient&) = delete;

  // Reads the slot map from the first seed that answers.
  static Result<std::unique_ptr<ClusterClient>> Connect(const ClusterOptions& options);

  // One command whose key is args[1] (GET, SET, DEL, EXISTS, ...). An error
  // reply is a Status: PermissionDenied for NOAUTH/NOPERM/WRONGPASS, else
  // IoError with Redis's message and the node.
  Result<RespValue> Command(std::span<const std::string_view> args);
  Result<RespValue> Command(std::initializer_list<std::string_view> args) {
    return Command(std::span<const std::string_view>(args.begin(), args.size()));
  }
  // Key commands, pipelined; results in the commands' order.
  std::vector<Result<RespValue>> Pipeline(const std::vector<std::vector<std::string_view>>& commands);
  // Key commands streamed with at most `window` outstanding (a sliding
  // window over all nodes, on connections of their own): each(i, reply) is
  // called in the commands' order as replies arrive, so a caller can use
  // the first replies while later ones are in flight. Redirected, transient
  // or lost replies are redone through Command before they are delivered.
  // each() returning false stops the stream (replies in flight are drained).
  // With `sink`, a bulk string reply read on the stream goes to sink(i,
  // bytes) from the reader's buffer (each() then sees it `sunk`); replies
  // redone through Command arrive in each() with their bytes instead.
  void Stream(const std::vector<std::vector<std::string_view>>& commands, size_t window,
              const std::function<bool(size_t, Result<RespValue>)>& each,
              const std::function<void(size_t, std::string_view)>& sink = {});
  // A command sent to one node ("host:port"), not routed, not retried.
  Result<RespValue> CommandAt(const std::string& node, std::span<const std::string_view> args);

  Status RefreshSlots();
  // The masters serving slots, "host:port".
  std::vector<std::string> Masters() const;
  // The node the map sends `slot` to ("" when unknown).
  std::string NodeForSlot(uint16_t slot) const;
  const ClusterStats& stats() const { return stats_; }

  // Tests: points every slot at `node`, so commands meet MOVED.
  void PointAllSlotsAtForTest(const std::string& node);

 private:
  explicit ClusterClient(const ClusterOptions& options);
  using Pool = std::map<std::string, std::unique_ptr<RespConnection>>;
  Result<RespConnection*> ConnectionTo(const std::string& node, Pool* pool = nullptr);
  void DropConnection(const std::string& node, Pool* pool = nullptr);
  int NodeIndex(const std::string& node);
  Status RefreshFrom(const std::string& node);
  // Error reply -> Status for the caller.
  Status ReplyError(const std::string& node, const std::string& message) const;

  ClusterOptions options_;
  std::shared_ptr<SSL_CTX> tls_;
  std::vector<std::string> nodes_;                  // every address seen
  std::array<int16_t, kClusterSlots> slot_node_{};  // index into nodes_; -1 unknown
  Pool conns_;         // Command, Pipeline, CommandAt
  Pool stream_conns_;  // Stream: replies outstanding there never meet Command's

  ClusterStats stats_;
};

}  // namespace flatkv::remote
