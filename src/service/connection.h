// Connection: the daemon's side of one client connection. Authenticates
// the hello, then serves one request at a time until the client leaves, a
// transport error, or the server stops (an idle connection is closed at
// once; a request being served finishes first).
//
// It is driven by the server's event loops (docs/service.md, "Threads"):
// OnReadable runs on a loop thread when the socket is readable, reads what
// is there without blocking, and answers whole small frames (hello, lookup,
// ping, stats, register_shm, error replies) inline; anything that can block
// (TLS, a put, a restore, a frame still arriving, a reply the socket did
// not take at once) goes to ServeOnWorker on a worker thread, which uses
// the blocking, deadline-bound I/O of net::Conn.
//
// Request-level failures (a bad frame payload, a store error, a deadline)
// are answered with an error frame and the connection stays usable; a
// malformed header or a transport failure closes it, since the stream can
// no longer be followed.
//
// Thread-safety: one thread at a time (the server hands a connection from
// its loop to a worker and back, out of the loop's epoll set meanwhile).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "service/tenants.h"
#include "service/frames.h"
#include "service/wire.h"

namespace flatkv::service {

class Server;
struct TenantMetrics;

class Connection {
 public:
  // `peer` is counted as unauthenticated by the server until the hello ends.
  Connection(Server* server, std::unique_ptr<net::Conn> conn, bool tls, std::string peer);
  ~Connection();

  // What the server does with the connection next.
  enum class Next { kWait, kWorker, kClose };
  // On an event loop, when the socket is readable. Never blocks.
  Next OnReadable();
  // On a worker, after OnReadable said kWorker.
  Next ServeOnWorker();

  bool logged_in() const { return tenant_ != nullptr; }
  Clock::time_point login_deadline() const { return login_deadline_; }
  int fd() const { return conn_->fd(); }
  uint32_t loop() const { return loop_; }
  void set_loop(uint32_t loop) { loop_ = loop; }

 private:
  struct Window {
    uint64_t id = 0;
    std::byte* base = nullptr;
    uint64_t bytes = 0;
  };

  Status Handshake();
  // Counts the peer out of the server's unauthenticated connections (once).
  void LeaveLogin();
  // Reads one request (blocking, bounded by io_timeout once it started)
  // and serves it; false when the connection must close.
  bool ServeRequest();
  // Non-OK only for transport failures (the connection is then closed).
  Status Dispatch(const wire::Header& h, std::span<const std::byte> payload, Clock::time_point arrival);
  Status Lookup(uint32_t id, const wire::Lookup& m, Clock::time_point arrival);
  Status Put(uint32_t id, const wire::Put& m, Clock::time_point arrival);
  // Drops one of the tenant's sessions (protocol 2): its blocks leave the
  // store unless another live session references them; its quota use is released.
  Status DropSession(uint32_t id, uint64_t session);
  Status Prefetch(uint32_t id, const wire::Lookup& m);
  // Protocol 4: retain a chain for ttl (capped by limits.max_retain_ms,
  // bounded by the tenant's pin budget), and drop a session's tail.
  Status Retain(uint32_t id, const wire::Retain& m);
  Status TruncateSession(uint32_t id, const wire::TruncateSession& m);
  // Protocol 6: a pruned view of the tenant's chain (Store::Prune), put in
  // the tenant's salted view session and charged to its quota.
  Status Prune(uint32_t id, const wire::Prune& m, Clock::time_point arrival);
  Status Restore(uint32_t id, const wire::Restore& m, Clock::time_point arrival);
  Status RegisterShm(uint32_t id, const wire::RegisterShm& m);
  // Sends a reply frame: on a worker, a blocking write until `deadline`; on
  // the loop, what the socket takes now, the rest kept in pending_ for a
  // worker to finish.
  Status Send(const std::vector<std::byte>& frame, Clock::time_point deadline);
  Status Reply(const std::vector<std::byte>& frame) { return Send(frame, WriteDeadline()); }
  Status Error(uint32_t id, const Status& status);
  Clock::time_point DeadlineOf(uint32_t deadline_ms, Clock::time_point arrival) const;
  Clock::time_point WriteDeadline() const;

  Server* server_;
  std::unique_ptr<net::Conn> conn_;
  bool tls_;
  std::string peer_;
  bool in_login_ = true;  // counted by Server::AdmitUnauthenticated
  Clock::time_point login_deadline_;
  uint32_t loop_ = 0;
  bool on_loop_ = false;
  std::vector<std::byte> pending_;  // reply bytes the loop could not write
  std::vector<std::byte> payload_;  // reused across requests
  const Tenant* tenant_ = nullptr;
  uint32_t protocol_ = wire::kMinProtocol;  // negotiated at hello
  TenantMetrics* metrics_ = nullptr;
  std::unique_ptr<KeySalter> salter_;
  std::vector<BlockKey> salted_;  // reused across requests
  std::vector<Window> windows_;
  uint64_t window_bytes_ = 0;
  uint64_t next_window_id_ = 1;
};

}  // namespace flatkv::service
