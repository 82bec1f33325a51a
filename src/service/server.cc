#include "service/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <list>

#include "common/log.h"
#include "flatkv/remote.h"
#include "service/connection.h"

namespace flatkv::service {

// The threads for work that can block. `keep` stay ready; a task that finds
// none idle starts another, and a thread that finishes when `keep` others
// are already idle leaves, so the pool is as large as the blocking work in
// flight (a stalled client holds one thread, as it always did).
class WorkerPool {
 public:
  explicit WorkerPool(uint32_t keep) : keep_(keep) {}
  ~WorkerPool() { Shutdown(); }

  void Submit(std::function<void()> task) FLATKV_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    JoinExited();
    tasks_.push_back(std::move(task));
    if (idle_ < tasks_.size()) {
      auto it = threads_.emplace(threads_.end());
      *it = std::thread([this, it] { Work(it); });
    } else {
      cv_.Signal();
    }
  }

  // Runs what is queued, then joins every thread.
  void Shutdown() FLATKV_EXCLUDES(mu_) {
    std::list<std::thread> all;
    {
      MutexLock lock(&mu_);
      stop_ = true;
      cv_.SignalAll();
      JoinExited();
      all.swap(threads_);
    }
    for (auto& t : all) t.join();
  }

 private:
  using Iter = std::list<std::thread>::iterator;

  void Work(Iter self) FLATKV_EXCLUDES(mu_) {
    for (;;) {
      std::function<void()> task;
      {
        MutexLock lock(&mu_);
        while (tasks_.empty() && !stop_) {
          ++idle_;
          cv_.Wait(&mu_);
          --idle_;
        }
        if (tasks_.empty()) return;  // stopping; Shutdown joins this thread
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
      MutexLock lock(&mu_);
      if (!stop_ && tasks_.empty() && idle_ >= keep_) {
        exited_.push_back(self);  // joined by the next Submit or Shutdown
        return;
      }
    }
  }

  void JoinExited() FLATKV_REQUIRES(mu_) {
    // An exited thread released mu_ last; joining it here cannot wait long.
    for (Iter it : exited_) {
      it->join();
      threads_.erase(it);
    }
    exited_.clear();
  }

  const uint32_t keep_;
  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> tasks_ FLATKV_GUARDED_BY(mu_);
  size_t idle_ FLATKV_GUARDED_BY(mu_) = 0;
  bool stop_ FLATKV_GUARDED_BY(mu_) = false;
  std::list<std::thread> threads_ FLATKV_GUARDED_BY(mu_);
  std::vector<Iter> exited_ FLATKV_GUARDED_BY(mu_);
};

// One event loop: an epoll set of connections (edge-triggered; a connection
// a worker serves is out of the set meanwhile, so it is with one thread at a
// time) and the stop eventfd. Connections that have
// not logged in are also listed with their login deadlines.
struct Server::Loop {
  int epfd = -1;
  int wake_fd = -1;  // eventfd: a new login deadline, for the loop's timer
  std::thread thread;
  Mutex mu;
  std::unordered_map<Connection*, Clock::time_point> logins FLATKV_GUARDED_BY(mu);
  ~Loop() {
    if (epfd >= 0) ::close(epfd);
    if (wake_fd >= 0) ::close(wake_fd);
  }
};

Result<std::unique_ptr<Server>> Server::Start(const ServerConfig& config) {
  std::unique_ptr<Server> s(new Server());
  s->config_ = config;
  // FinalizeConfig refuses these too; a config that skipped it must not open TCP to everyone.
  if (!config.tcp_address.empty() && config.tenants.empty()) {
    return Status::InvalidArgument("listen.tcp '" + config.tcp_address + "' needs at least one [[tenants]] entry with a token");
  }
  if (config.allow_remote && (config.tls_cert_file.empty() || config.tenants.empty())) {
    return Status::InvalidArgument("listen.allow_remote = true needs [tls] cert and key and at least one [[tenants]] entry");
  }
  FLATKV_ASSIGN_OR_RETURN(s->tenants_, TenantRegistry::Make(config.tenants));
  for (size_t i = 0; i < s->tenants_->tenants().size(); ++i) s->tenant_metrics_.push_back(std::make_unique<TenantMetrics>());
  if (!config.tls_cert_file.empty()) {
    FLATKV_ASSIGN_OR_RETURN(s->tls_, net::MakeServerTlsContext(config.tls_cert_file, config.tls_key_file));
  }
  for (const std::string& dir : config.store.ssd_dirs) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return Status::PermissionDenied("creating SSD directory " + dir + ": " + ec.message());
  }
  RegisterRemoteMedium();  // the daemon composes its store with every medium it links
  auto store = Store::Open(config.store);
  if (!store.ok()) return store.status().WithContext("opening the store");
  s->store_ = std::move(store).value();
  // A put frame must hold at least one block, a restore frame one layer slice.
  const uint64_t least = s->store_->BlockBytes() + 1024;
  if (config.max_frame_bytes < least) {
    (void)s->store_->Close();
    s->store_.reset();
    return Status::InvalidArgument("limits.max_frame_bytes " + std::to_string(config.max_frame_bytes) +
                                   " cannot hold one block of this shape (" + std::to_string(least) + " bytes with headers)");
  }
  s->stop_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (s->stop_fd_ < 0) return Status::FromErrno(errno, "eventfd");
  net::IgnoreSigpipe();
  s->pool_ = std::make_unique<WorkerPool>(config.workers);
  for (uint32_t i = 0; i < std::max<uint32_t>(1, config.loop_threads); ++i) {
    auto loop = std::make_unique<Loop>();
    loop->epfd = ::epoll_create1(EPOLL_CLOEXEC);
    loop->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (loop->epfd < 0 || loop->wake_fd < 0) {
      const int err = errno;
      (void)s->Stop();
      return Status::FromErrno(err, "epoll_create1");
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;  // the stop eventfd: level-triggered, wakes every loop
    ::epoll_ctl(loop->epfd, EPOLL_CTL_ADD, s->stop_fd_, &ev);
    ev.data.ptr = &loop->wake_fd;
    ::epoll_ctl(loop->epfd, EPOLL_CTL_ADD, loop->wake_fd, &ev);
    Loop* raw = loop.get();
    Server* self = s.get();
    loop->thread = std::thread([self, raw] { self->EventLoop(raw); });
    s->loops_.push_back(std::move(loop));
  }
  if (Status st = s->Listen(); !st.ok()) {
    (void)s->Stop();
    return st;
  }
  return s;
}

namespace {

// The Unix socket's directory: created with mode 0700 when missing; an
// existing one must be ours and not writable by group or others (who could
// replace the socket with their own).
Status PrepareSocketDirectory(const std::string& socket_path) {
  const auto parent = std::filesystem::path(socket_path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    std::error_code ec;
    const auto above = std::filesystem::path(dir).parent_path();
    if (!above.empty()) std::filesystem::create_directories(above, ec);
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return Status::FromErrno(errno, "listen.unix: creating the socket directory " + dir + " (mode 0700)");
    }
    if (::stat(dir.c_str(), &st) != 0) return Status::FromErrno(errno, "listen.unix: " + dir);
  }
  if (!S_ISDIR(st.st_mode)) return Status::InvalidArgument("listen.unix: " + dir + " is not a directory");
  if (st.st_uid != ::geteuid()) {
    return Status::PermissionDenied("listen.unix: the socket directory " + dir + " belongs to uid " + std::to_string(st.st_uid) +
                                    ", not this daemon's uid " + std::to_string(::geteuid()) +
                                    "; set listen.unix to a path in a directory of your own (mode 0700)");
  }
  if (st.st_mode & 022) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return Status::PermissionDenied("listen.unix: the socket directory " + dir + " has mode " + mode +
                                    ": group or others can write there; chmod 0700 " + dir +
                                    " or set listen.unix to a path in a private directory");
  }
  return Status::Ok();
}

// Who a peer is, for the cap on unauthenticated connections: a TCP peer's
// IP address, a Unix peer's uid.
std::string PeerKey(int fd, bool unix_socket) {
  if (unix_socket) {
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) return "uid " + std::to_string(cred.uid);
    return "uid ?";
  }
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  char host[INET6_ADDRSTRLEN] = "?";
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
    if (ss.ss_family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr, host, sizeof host);
    } else if (ss.ss_family == AF_INET6) {
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr, host, sizeof host);
    }
  }
  return host;
}

}  // namespace

bool Server::AdmitUnauthenticated(const std::string& peer) {
  MutexLock lock(&peers_mu_);
  uint32_t& n = unauthenticated_[peer];
  if (n >= config_.max_unauthenticated_per_peer) return false;
  ++n;
  return true;
}

void Server::LoggedInOrGone(const std::string& peer) {
  MutexLock lock(&peers_mu_);
  auto it = unauthenticated_.find(peer);
  if (it == unauthenticated_.end()) return;
  if (--it->second == 0) unauthenticated_.erase(it);
}

Status Server::Listen() {
  if (!config_.unix_path.empty()) {
    FLATKV_RETURN_IF_ERROR(PrepareSocketDirectory(config_.unix_path));
    FLATKV_ASSIGN_OR_RETURN(net::Endpoint ep, net::ParseEndpoint("unix:" + config_.unix_path));
    FLATKV_ASSIGN_OR_RETURN(int fd, net::Listen(ep, nullptr));
    listen_fds_.push_back(fd);
    unix_path_ = config_.unix_path;
    unix_address_ = "unix:" + config_.unix_path;
    acceptors_.emplace_back([this, fd] { AcceptLoop(fd, true, false); });
  }
  if (!config_.tcp_address.empty()) {
    FLATKV_ASSIGN_OR_RETURN(net::Endpoint ep, net::ParseEndpoint("tcp:" + config_.tcp_address));
    uint16_t port = 0;
    FLATKV_ASSIGN_OR_RETURN(int fd, net::Listen(ep, &port));
    listen_fds_.push_back(fd);
    tcp_address_ = "tcp:" + ep.host + ":" + std::to_string(port);
    acceptors_.emplace_back([this, fd] { AcceptLoop(fd, false, tls_ != nullptr); });
  }
  if (!config_.http_address.empty()) {
    FLATKV_ASSIGN_OR_RETURN(net::Endpoint ep, net::ParseEndpoint("tcp:" + config_.http_address));
    uint16_t port = 0;
    FLATKV_ASSIGN_OR_RETURN(int fd, net::Listen(ep, &port));
    listen_fds_.push_back(fd);
    http_address_ = ep.host + ":" + std::to_string(port);
    acceptors_.emplace_back([this, fd] { HttpLoop(fd); });
  }
  return Status::Ok();
}

Server::~Server() { (void)Stop(); }

void Server::RequestStop() {
  MutexLock lock(&wait_mu_);
  stop_requested_ = true;
  wait_cv_.SignalAll();
}

void Server::Wait() {
  MutexLock lock(&wait_mu_);
  while (!stop_requested_) wait_cv_.Wait(&wait_mu_);
}

Status Server::Stop() {
  if (stopped_) return close_status_;
  stopped_ = true;
  stopping_.store(true);
  if (stop_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!::write(stop_fd_, &one, sizeof one);
  }
  for (auto& t : acceptors_) t.join();
  acceptors_.clear();
  for (int fd : listen_fds_) ::close(fd);
  listen_fds_.clear();
  if (!unix_path_.empty()) ::unlink(unix_path_.c_str());
  for (auto& loop : loops_) {
    if (loop->thread.joinable()) loop->thread.join();
  }
  if (pool_) pool_->Shutdown();  // each connection on a worker finishes the request it is serving
  {
    // What is left was idle in a loop: closed now.
    std::unordered_map<Connection*, std::unique_ptr<Connection>> idle;
    {
      MutexLock lock(&conns_mu_);
      idle.swap(conns_);
    }
  }
  loops_.clear();
  if (store_) close_status_ = store_->Close();
  if (stop_fd_ >= 0) ::close(stop_fd_);
  stop_fd_ = -1;
  RequestStop();
  return close_status_;
}

void Server::EventLoop(Loop* loop) {
  epoll_event events[64];
  while (!stopping_.load()) {
    int timeout_ms = -1;
    {
      MutexLock lock(&loop->mu);
      if (!loop->logins.empty()) {
        Clock::time_point first = Clock::time_point::max();
        for (const auto& [c, deadline] : loop->logins) first = std::min(first, deadline);
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(first - Clock::now()).count();
        timeout_ms = static_cast<int>(std::clamp<int64_t>(left, 0, 60000));
      }
    }
    const int n = ::epoll_wait(loop->epfd, events, 64, timeout_ms);
    if (n < 0 && errno != EINTR) {
      LogInfo("flatkv serve: epoll_wait: " + Status::FromErrno(errno, "event loop").ToString());
      break;
    }
    for (int i = 0; i < n; ++i) {
      if (events[i].data.ptr == nullptr) continue;  // stopping
      if (events[i].data.ptr == &loop->wake_fd) {  // a new login deadline: the timeout is recomputed
        uint64_t n_wakes;
        (void)!::read(loop->wake_fd, &n_wakes, sizeof n_wakes);
        continue;
      }
      auto* c = static_cast<Connection*>(events[i].data.ptr);
      {
        MutexLock lock(&loop->mu);
        loop->logins.erase(c);
      }
      ServeOnLoop(loop, c);
    }
    // Connections that have not logged in within login_timeout are closed.
    std::vector<Connection*> expired;
    {
      MutexLock lock(&loop->mu);
      const auto now = Clock::now();
      for (auto it = loop->logins.begin(); it != loop->logins.end();) {
        if (it->second <= now) {
          expired.push_back(it->first);
          it = loop->logins.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (Connection* c : expired) {
      (void)Unregister(loop, c);
      CloseConnection(c);
    }
  }
}

// A connection answered on its loop stays in the loop's set, so a request
// served inline costs no epoll_ctl (re-arming a one-shot registration after
// every request was a third of the loop thread's time, docs/benchmarks.md).
// The registration is edge-triggered: OnReadable reads until the socket is
// empty (a short read or EAGAIN), and the loop is told of the connection
// again when its next bytes come, in the order connections become ready
// (epoll_wait re-queues a level-triggered item as it reports it, so the
// connections just served would be first in line again: lookup p99 rose
// 10%). One handed to a worker leaves the set first, so that no loop serves
// it while the worker does; Park adds it back, and an add reports bytes that
// came meanwhile.
void Server::ServeOnLoop(Loop* loop, Connection* c) {
  const Connection::Next next = c->OnReadable();
  if (next == Connection::Next::kWait && !stopping_.load()) {
    if (!c->logged_in()) {
      MutexLock lock(&loop->mu);
      loop->logins[c] = c->login_deadline();  // the loop recomputes its timeout before it waits
    }
    return;
  }
  if (!Unregister(loop, c) || next != Connection::Next::kWorker) {
    CloseConnection(c);
    return;
  }
  Route(c, next);
}

// Takes c out of its loop's set. Closing its socket is not enough: while
// another process holds a copy of the descriptor (a child between fork and
// exec), the registration outlives the close and would report a freed c.
bool Server::Unregister(Loop* loop, Connection* c) {
  if (::epoll_ctl(loop->epfd, EPOLL_CTL_DEL, c->fd(), nullptr) == 0) return true;
  LogInfo("flatkv serve: epoll_ctl: " + Status::FromErrno(errno, "taking a connection out of its loop").ToString());
  return false;
}

void Server::Park(Connection* c) {
  Loop& loop = *loops_[c->loop()];
  const bool login = !c->logged_in();
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLET;
  ev.data.ptr = c;
  bool armed;
  {
    // Added under loop.mu, which the loop takes before it serves the event:
    // everything this thread did to c (and the epoll_ctl itself) happens
    // before the loop thread touches c again, as a thread sanitizer sees it
    // too (it does not see the ordering epoll gives through the kernel).
    // Once added, c may be served, even closed: it is not touched after.
    MutexLock lock(&loop.mu);
    if (login) loop.logins[c] = c->login_deadline();
    armed = ::epoll_ctl(loop.epfd, EPOLL_CTL_ADD, c->fd(), &ev) == 0;
    if (!armed) {
      LogInfo("flatkv serve: epoll_ctl: " + Status::FromErrno(errno, "registering a connection").ToString());
      loop.logins.erase(c);
    }
  }
  if (!armed) {
    CloseConnection(c);
    return;
  }
  if (login) {
    const uint64_t one = 1;  // a new login deadline: the loop recomputes its timeout
    (void)!::write(loop.wake_fd, &one, sizeof one);
  }
}

void Server::Route(Connection* c, Connection::Next next) {
  switch (next) {
    case Connection::Next::kWait:
      // A connection a worker finishes with while stopping is closed, not parked.
      if (stopping_.load()) {
        CloseConnection(c);
      } else {
        Park(c);
      }
      return;
    case Connection::Next::kWorker:
      pool_->Submit([this, c] { Route(c, c->ServeOnWorker()); });
      return;
    case Connection::Next::kClose:
      CloseConnection(c);
      return;
  }
}

void Server::CloseConnection(Connection* c) {
  std::unique_ptr<Connection> gone;
  {
    MutexLock lock(&conns_mu_);
    auto it = conns_.find(c);
    if (it == conns_.end()) return;
    gone = std::move(it->second);
    conns_.erase(it);
  }
  // Destroyed outside the lock: closing the socket also leaves the epoll set.
}

void Server::AcceptLoop(int listen_fd, bool unix_socket, bool tls) {
  pollfd p[2] = {{listen_fd, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
  while (!stopping_.load()) {
    const int rc = ::poll(p, 2, 1000);
    if (rc < 0 && errno != EINTR) break;
    if (rc <= 0 || p[1].revents) continue;
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    if (!unix_socket) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    auto conn = std::make_unique<net::Conn>(fd, unix_socket);
    auto refuse = [&](const std::string& why) {
      metrics_.connections_refused.fetch_add(1, std::memory_order_relaxed);
      if (!tls) (void)conn->Write(wire::EncodeError(0, Status::NoSpace(why)), Clock::now() + std::chrono::milliseconds(100));
    };
    if (metrics_.connections_active.load() >= config_.max_connections) {
      refuse("the daemon is at its limit of " + std::to_string(config_.max_connections) + " connections");
      continue;
    }
    std::string peer = PeerKey(fd, unix_socket);
    if (!AdmitUnauthenticated(peer)) {
      refuse("too many connections from " + peer + " have not logged in (limits.max_unauthenticated_per_peer = " +
             std::to_string(config_.max_unauthenticated_per_peer) + ")");
      continue;
    }
    auto owned = std::make_unique<Connection>(this, std::move(conn), tls, std::move(peer));
    Connection* c = owned.get();
    c->set_loop(next_loop_.fetch_add(1, std::memory_order_relaxed) % static_cast<uint32_t>(loops_.size()));
    {
      MutexLock lock(&conns_mu_);
      conns_.emplace(c, std::move(owned));
    }
    Park(c);
  }
}

void Server::HttpLoop(int listen_fd) {
  pollfd p[2] = {{listen_fd, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
  while (!stopping_.load()) {
    const int rc = ::poll(p, 2, 1000);
    if (rc < 0 && errno != EINTR) break;
    if (rc <= 0 || p[1].revents) continue;
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) ServeHttp(fd);
  }
}

// One request per connection, HTTP/1.0 style: GET /metrics, /healthz, /stats.
void Server::ServeHttp(int fd) {
  net::Conn conn(fd, false);
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  std::string req;
  char buf[1024];
  while (req.find("\r\n\r\n") == std::string::npos && req.find("\n\n") == std::string::npos && req.size() < 8192) {
    pollfd p{fd, POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) != 1) return;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    req.append(buf, static_cast<size_t>(n));
  }
  std::string status = "200 OK", type = "text/plain; version=0.0.4; charset=utf-8", body, extra;
  const size_t sp1 = req.find(' '), sp2 = sp1 == std::string::npos ? sp1 : req.find(' ', sp1 + 1);
  const std::string method = req.substr(0, sp1);
  std::string path = sp2 == std::string::npos ? "" : req.substr(sp1 + 1, sp2 - sp1 - 1);
  if (const size_t q = path.find('?'); q != std::string::npos) path.resize(q);
  if (method != "GET" && method != "HEAD") {
    status = "405 Method Not Allowed";
    body = "only GET\n";
  } else if (path == "/metrics") {
    body = PrometheusText();
  } else if (path == "/healthz") {
    const bool ok = healthy();
    status = ok ? "200 OK" : "503 Service Unavailable";
    body = ok ? "ok\n" : "stopping\n";
  } else if (path == "/stats" && !HttpBearerMatches(req, config_.stats_token)) {
    status = "401 Unauthorized";
    extra = "WWW-Authenticate: Bearer realm=\"flatkv\"\r\n";
    body =
        config_.stats_token.empty()
            ? "/stats is disabled: set metrics.stats_token in the config and send it as 'Authorization: Bearer TOKEN'\n"
            : "/stats needs 'Authorization: Bearer TOKEN' with the configured metrics.stats_token\n";
  } else if (path == "/stats") {
    type = "application/json";
    body = StatsJson() + "\n";
  } else {
    status = "404 Not Found";
    body = "not found: try /metrics, /healthz or /stats\n";
  }
  std::string head = "HTTP/1.0 " + status + "\r\nContent-Type: " + type + "\r\nContent-Length: " + std::to_string(body.size()) +
                     "\r\n" + extra + "Connection: close\r\n\r\n";
  if (method == "HEAD") body.clear();
  (void)conn.Write(std::as_bytes(std::span(head)), std::as_bytes(std::span(body)), deadline);
}

std::vector<TenantView> Server::Views(const StoreStats& stats, const Tenant* only) const {
  std::vector<TenantView> v;
  for (const Tenant& t : tenants_->tenants()) {
    if (only && t.index != only->index) continue;
    auto dram = stats.tenant_dram_bytes.find(t.index + 1);  // the PutOptions::tenant connections pass
    v.push_back({t.name, tenant_metrics_[t.index].get(), t.quota_bytes, tenants_->UsedBytes(t), tenants_->DroppedSessions(t),
                 dram == stats.tenant_dram_bytes.end() ? 0 : dram->second, tenants_->RetainedBytes(t)});
  }
  return v;
}

std::string Server::PrometheusText() const {
  const StoreStats stats = store_->Stats();
  return RenderPrometheus(stats, metrics_, Views(stats), config_.metrics_tenant_labels);
}
std::string Server::StatsJson(const Tenant* viewer) const {
  const StoreStats stats = store_->Stats();
  return RenderStatsJson(stats, store_->options(), metrics_, Views(stats, viewer));
}

}  // namespace flatkv::service
