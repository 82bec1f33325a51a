#include "service/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/log.h"
#include "service/connection.h"

namespace flatkv::service {

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
    FLATKV_ASSIGN_OR_RETURN(s->tls_, MakeServerTlsContext(config.tls_cert_file, config.tls_key_file));
  }
  for (const std::string& dir : config.store.ssd_dirs) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return Status::PermissionDenied("creating SSD directory " + dir + ": " + ec.message());
  }
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
  IgnoreSigpipe();
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
    FLATKV_ASSIGN_OR_RETURN(Endpoint ep, ParseEndpoint("unix:" + config_.unix_path));
    FLATKV_ASSIGN_OR_RETURN(int fd, service::Listen(ep, nullptr));
    listen_fds_.push_back(fd);
    unix_path_ = config_.unix_path;
    unix_address_ = "unix:" + config_.unix_path;
    acceptors_.emplace_back([this, fd] { AcceptLoop(fd, true, false); });
  }
  if (!config_.tcp_address.empty()) {
    FLATKV_ASSIGN_OR_RETURN(Endpoint ep, ParseEndpoint("tcp:" + config_.tcp_address));
    uint16_t port = 0;
    FLATKV_ASSIGN_OR_RETURN(int fd, service::Listen(ep, &port));
    listen_fds_.push_back(fd);
    tcp_address_ = "tcp:" + ep.host + ":" + std::to_string(port);
    acceptors_.emplace_back([this, fd] { AcceptLoop(fd, false, tls_ != nullptr); });
  }
  if (!config_.http_address.empty()) {
    FLATKV_ASSIGN_OR_RETURN(Endpoint ep, ParseEndpoint("tcp:" + config_.http_address));
    uint16_t port = 0;
    FLATKV_ASSIGN_OR_RETURN(int fd, service::Listen(ep, &port));
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
  ReapConnections(true);  // each finishes the request it is serving
  if (store_) close_status_ = store_->Close();
  if (stop_fd_ >= 0) ::close(stop_fd_);
  stop_fd_ = -1;
  RequestStop();
  return close_status_;
}

void Server::ReapConnections(bool all) {
  std::list<ConnSlot> finished;
  {
    MutexLock lock(&conns_mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      auto next = std::next(it);
      if (all || it->done.load()) finished.splice(finished.end(), conns_, it);
      it = next;
    }
  }
  for (auto& slot : finished) slot.thread.join();
}

void Server::AcceptLoop(int listen_fd, bool unix_socket, bool tls) {
  pollfd p[2] = {{listen_fd, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
  while (!stopping_.load()) {
    const int rc = ::poll(p, 2, 1000);
    if (rc < 0 && errno != EINTR) break;
    ReapConnections(false);
    if (rc <= 0 || p[1].revents) continue;
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    if (!unix_socket) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    auto conn = std::make_unique<Conn>(fd, unix_socket);
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
    MutexLock lock(&conns_mu_);
    ConnSlot& slot = conns_.emplace_back();
    slot.conn = std::make_unique<Connection>(this, std::move(conn), tls, std::move(peer));
    slot.thread = std::thread([&slot] {
      slot.conn->Run();
      slot.conn.reset();
      slot.done.store(true);
    });
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
  Conn conn(fd, false);
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

std::vector<TenantView> Server::Views(const Tenant* only) const {
  std::vector<TenantView> v;
  for (const Tenant& t : tenants_->tenants()) {
    if (only && t.index != only->index) continue;
    v.push_back({t.name, tenant_metrics_[t.index].get(), t.quota_bytes, tenants_->UsedBytes(t), tenants_->DroppedSessions(t)});
  }
  return v;
}

std::string Server::PrometheusText() const {
  return RenderPrometheus(store_->Stats(), metrics_, Views(), config_.metrics_tenant_labels);
}
std::string Server::StatsJson(const Tenant* viewer) const {
  return RenderStatsJson(store_->Stats(), store_->options(), metrics_, Views(viewer));
}

}  // namespace flatkv::service
