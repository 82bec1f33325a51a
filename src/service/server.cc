#include "service/server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/log.h"
#include "service/connection.h"

namespace flatkv::service {

Result<std::unique_ptr<Server>> Server::Start(const ServerConfig& config) {
  std::unique_ptr<Server> s(new Server());
  s->config_ = config;
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

Status Server::Listen() {
  if (!config_.unix_path.empty()) {
    std::error_code ec;
    const auto parent = std::filesystem::path(config_.unix_path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
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
    if (metrics_.connections_active.load() >= config_.max_connections) {
      metrics_.connections_refused.fetch_add(1, std::memory_order_relaxed);
      if (!tls) {
        (void)conn->Write(wire::EncodeError(0, Status::NoSpace("the daemon is at its limit of " +
                                                               std::to_string(config_.max_connections) + " connections")),
                          Clock::now() + std::chrono::milliseconds(100));
      }
      continue;
    }
    MutexLock lock(&conns_mu_);
    ConnSlot& slot = conns_.emplace_back();
    slot.conn = std::make_unique<Connection>(this, std::move(conn), tls);
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

std::vector<TenantView> Server::Views() const {
  std::vector<TenantView> v;
  for (const Tenant& t : tenants_->tenants()) {
    v.push_back({t.name, tenant_metrics_[t.index].get(), t.quota_bytes, tenants_->UsedBytes(t), tenants_->DroppedSessions(t)});
  }
  return v;
}

std::string Server::PrometheusText() const {
  return RenderPrometheus(store_->Stats(), metrics_, Views(), config_.metrics_tenant_labels);
}
std::string Server::StatsJson() const { return RenderStatsJson(store_->Stats(), store_->options(), metrics_, Views()); }

}  // namespace flatkv::service
