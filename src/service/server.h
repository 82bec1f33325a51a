// Server: the `flatkv serve` daemon in a library. It opens one Store and
// serves the wire protocol (docs/format_wire.md) on a Unix socket and on
// TCP (optionally TLS), and HTTP (/metrics, /healthz, /stats) on a
// separate loopback port.
//
// Threads (docs/service.md, "Threads"): one accept thread per listener
// hands each connection, round robin, to one of `loop_threads` event loops
// (epoll, one thread each). A loop waits for all its connections at once:
// an idle connection costs no thread. When one is readable the loop reads
// what is there without blocking and answers whole small frames (hello,
// lookup, ping, stats, register_shm) itself, with no handoff. Work that
// can block -- TLS, puts, restores, a frame still arriving, a reply the
// socket would not take -- goes to a worker pool that keeps `workers`
// threads ready and starts more while all are busy (so a slow or stalled
// client only ever holds one thread, as before; its writes time out after
// io_timeout and the connection is dropped), then gives the connection
// back to its loop. Store calls are thread-safe and never hold the store's
// lock across I/O, so requests proceed in parallel.
//
// Stop(): stop accepting, let every connection finish the request it is
// serving (idle connections are closed at once), then Close() the store,
// which persists the SSD index. A later Start() on the same directories
// restarts warm.
//
// Thread-safety: Start/Stop from one controlling thread; accessors from any.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "flatkv/store.h"
#include "service/config.h"
#include "service/connection.h"
#include "service/metrics.h"
#include "service/tenants.h"
#include "service/frames.h"

namespace flatkv::service {

class WorkerPool;

class Server {
 public:
  // Opens the store (config.store, already finalized: see FinalizeConfig)
  // and starts listening. Fails with the store's or the socket's Status.
  static Result<std::unique_ptr<Server>> Start(const ServerConfig& config);
  ~Server();  // Stop()s if still running

  // Graceful stop; returns the store's Close() status. Idempotent.
  Status Stop();
  // Blocks until Stop() has been called (from another thread or a signal
  // handler's thread via RequestStop()).
  void Wait();
  // Asks the Wait()ing thread to Stop(); safe from any thread.
  void RequestStop();

  // Addresses actually bound ("unix:/path", "tcp:127.0.0.1:7471",
  // "127.0.0.1:7472"); empty when disabled.
  const std::string& unix_address() const { return unix_address_; }
  const std::string& tcp_address() const { return tcp_address_; }
  const std::string& http_address() const { return http_address_; }

  Store& store() { return *store_; }
  const ServerConfig& config() const { return config_; }
  const ServerMetrics& metrics() const { return metrics_; }
  const TenantRegistry& tenants() const { return *tenants_; }
  std::string PrometheusText() const;
  // Every tenant's counters (HTTP /stats, behind metrics.stats_token); with
  // `viewer`, only that tenant's (the protocol's stats request: a tenant's
  // token shows neither other tenants' names nor their traffic).
  std::string StatsJson(const Tenant* viewer = nullptr) const;
  bool healthy() const { return !stopping_.load(); }

 private:
  friend class Connection;
  Server() = default;
  Status Listen();
  void AcceptLoop(int listen_fd, bool unix_socket, bool tls);
  void HttpLoop(int listen_fd);
  void ServeHttp(int fd);
  // The event loops (server.cc): each runs EventLoop on its own thread.
  struct Loop;
  void EventLoop(Loop* loop);
  // Serves a readable connection on its loop thread and acts on what it asks for next.
  void ServeOnLoop(Loop* loop, Connection* c);
  bool Unregister(Loop* loop, Connection* c);  // false (logged) if epoll refused
  // Acts on what a connection asked for next (wait, a worker, close).
  void Route(Connection* c, Connection::Next next);
  void Park(Connection* c);  // adds it to its loop's set: it is served when readable
  void CloseConnection(Connection* c) FLATKV_EXCLUDES(conns_mu_);
  // The per-peer count of connections that have not logged in: false when
  // `peer` is at limits.max_unauthenticated_per_peer. Every admitted
  // connection calls LoggedInOrGone once, after its hello (either outcome).
  bool AdmitUnauthenticated(const std::string& peer) FLATKV_EXCLUDES(peers_mu_);
  void LoggedInOrGone(const std::string& peer) FLATKV_EXCLUDES(peers_mu_);
  std::vector<TenantView> Views(const StoreStats& stats, const Tenant* only = nullptr) const;

  ServerConfig config_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<TenantRegistry> tenants_;
  std::vector<std::unique_ptr<TenantMetrics>> tenant_metrics_;  // by Tenant::index
  ServerMetrics metrics_;
  std::shared_ptr<SSL_CTX> tls_;
  std::string unix_address_, tcp_address_, http_address_;
  std::string unix_path_;  // removed on Stop

  int stop_fd_ = -1;  // eventfd: readable once stopping
  std::atomic<bool> stopping_{false};
  bool stopped_ = false;
  Status close_status_;
  std::vector<int> listen_fds_;
  std::vector<std::thread> acceptors_;

  std::vector<std::unique_ptr<Loop>> loops_;
  std::atomic<uint32_t> next_loop_{0};
  std::unique_ptr<WorkerPool> pool_;

  Mutex conns_mu_;
  std::unordered_map<Connection*, std::unique_ptr<Connection>> conns_ FLATKV_GUARDED_BY(conns_mu_);

  Mutex peers_mu_;
  std::unordered_map<std::string, uint32_t> unauthenticated_ FLATKV_GUARDED_BY(peers_mu_);

  Mutex wait_mu_;
  CondVar wait_cv_;
  bool stop_requested_ FLATKV_GUARDED_BY(wait_mu_) = false;
};

}  // namespace flatkv::service
