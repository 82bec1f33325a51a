// Connection: the daemon's side of one client connection. Authenticates
// the hello, then serves one request at a time until the client leaves, a
// transport error, or the server stops (an idle connection is closed at
// once; a request being served finishes first).
//
// Request-level failures (a bad frame payload, a store error, a deadline)
// are answered with an error frame and the connection stays usable; a
// malformed header or a transport failure closes it, since the stream can
// no longer be followed.
//
// Thread-safety: Run() on the connection's own thread; nothing else.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "service/tenants.h"
#include "service/transport.h"
#include "service/wire.h"

namespace flatkv::service {

class Server;
struct TenantMetrics;

class Connection {
 public:
  // `peer` is counted as unauthenticated by the server until the hello ends.
  Connection(Server* server, std::unique_ptr<Conn> conn, bool tls, std::string peer);
  ~Connection();
  void Run();

 private:
  struct Window {
    uint64_t id = 0;
    std::byte* base = nullptr;
    uint64_t bytes = 0;
  };

  Status Handshake();
  bool WaitForRequest();  // false on stop, EOF or error
  // Non-OK only for transport failures (the connection is then closed).
  Status Dispatch(const wire::Header& h, std::span<const std::byte> payload, Clock::time_point arrival);
  Status Lookup(uint32_t id, const wire::Lookup& m, Clock::time_point arrival);
  Status Put(uint32_t id, const wire::Put& m, Clock::time_point arrival);
  // Drops one of the tenant's sessions (protocol 2): its blocks leave the
  // store unless another live session references them; its quota use is released.
  Status DropSession(uint32_t id, uint64_t session);
  Status Restore(uint32_t id, const wire::Restore& m, Clock::time_point arrival);
  Status RegisterShm(uint32_t id, const wire::RegisterShm& m);
  Status Reply(const std::vector<std::byte>& frame);
  Status Error(uint32_t id, const Status& status);
  Clock::time_point DeadlineOf(uint32_t deadline_ms, Clock::time_point arrival) const;
  Clock::time_point WriteDeadline() const;

  Server* server_;
  std::unique_ptr<Conn> conn_;
  bool tls_;
  std::string peer_;
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
