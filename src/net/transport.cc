#include "net/transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

namespace flatkv::net {
namespace {

int RemainingMs(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > INT_MAX ? INT_MAX : static_cast<int>(left);
}

std::string SslErrors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "no OpenSSL error queued" : out;
}

Status Deadline(std::string_view what) { return Status::Aborted(std::string(what) + ": deadline exceeded"); }

}  // namespace

Result<Endpoint> ParseEndpoint(const std::string& address) {
  Endpoint ep;
  std::string rest = address;
  if (address.rfind("unix:", 0) == 0 || (!address.empty() && address[0] == '/')) {
    ep.kind = Endpoint::kUnix;
    ep.path = address[0] == '/' ? address : address.substr(5);
    if (ep.path.empty()) return Status::InvalidArgument("address '" + address + "': empty socket path");
    if (ep.path.size() >= sizeof(sockaddr_un{}.sun_path)) {
      return Status::InvalidArgument("address '" + address + "': socket path longer than " +
                                     std::to_string(sizeof(sockaddr_un{}.sun_path) - 1) + " bytes");
    }
    return ep;
  }
  if (rest.rfind("tcp:", 0) == 0) rest = rest.substr(4);
  ep.kind = Endpoint::kTcp;
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return Status::InvalidArgument("address '" + address + "': expected unix:PATH or tcp:HOST:PORT");
  }
  ep.host = rest.substr(0, colon);
  if (ep.host.size() > 2 && ep.host.front() == '[' && ep.host.back() == ']') ep.host = ep.host.substr(1, ep.host.size() - 2);
  const std::string port = rest.substr(colon + 1);
  char* end = nullptr;
  const unsigned long p = std::strtoul(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || p > 65535) {
    return Status::InvalidArgument("address '" + address + "': bad port '" + port + "'");
  }
  ep.port = static_cast<uint16_t>(p);
  return ep;
}

bool IsLoopbackHost(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr a{};
  if (inet_pton(AF_INET, host.c_str(), &a) == 1) return (ntohl(a.s_addr) >> 24) == 127;
  return false;
}

static Result<addrinfo*> Resolve(const Endpoint& ep, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(ep.port);
  if (int rc = getaddrinfo(ep.host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return Status::InvalidArgument("resolving '" + ep.host + "': " + gai_strerror(rc));
  }
  return res;
}

Result<int> Listen(const Endpoint& ep, uint16_t* bound_port) {
  if (ep.kind == Endpoint::kUnix) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Status::FromErrno(errno, "socket(AF_UNIX)");
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::memcpy(sa.sun_path, ep.path.c_str(), ep.path.size() + 1);
    // A stale socket file from a daemon that died is replaced; a live one is not.
    if (::access(ep.path.c_str(), F_OK) == 0) {
      int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      const bool live = probe >= 0 && ::connect(probe, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
      if (probe >= 0) ::close(probe);
      if (live) {
        ::close(fd);
        return Status::FailedPrecondition("unix socket " + ep.path + ": another daemon is listening there");
      }
      ::unlink(ep.path.c_str());
    }
    // Owner-only from the moment it exists: the umask applies at bind, so
    // no other user can connect in a window before a chmod. The umask is
    // process-wide; a file another thread creates meanwhile only comes out
    // more private (0600), never less.
    const mode_t old_mask = ::umask(0177);
    const int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
    const int bind_errno = errno;
    ::umask(old_mask);
    if (rc != 0 || ::listen(fd, 256) != 0) {
      Status st = Status::FromErrno(rc != 0 ? bind_errno : errno, "binding unix socket " + ep.path);
      ::close(fd);
      return st;
    }
    return fd;
  }
  FLATKV_ASSIGN_OR_RETURN(addrinfo * res, Resolve(ep, true));
  Status last = Status::IoError("no address for " + ep.host);
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, 256) != 0) {
      last = Status::FromErrno(errno, "binding tcp " + ep.host + ":" + std::to_string(ep.port));
      ::close(fd);
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
    if (bound_port) {
      *bound_port = ss.ss_family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port)
                                             : ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
    }
    freeaddrinfo(res);
    return fd;
  }
  freeaddrinfo(res);
  return last;
}

Result<int> ConnectSocket(const Endpoint& ep, std::chrono::milliseconds timeout) {
  if (ep.kind == Endpoint::kUnix) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Status::FromErrno(errno, "socket(AF_UNIX)");
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::memcpy(sa.sun_path, ep.path.c_str(), ep.path.size() + 1);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
      Status st = Status::FromErrno(errno, "connecting to unix:" + ep.path);
      ::close(fd);
      return Status::IoError(st.message());
    }
    return fd;
  }
  FLATKV_ASSIGN_OR_RETURN(addrinfo * res, Resolve(ep, false));
  Status last = Status::IoError("no address for " + ep.host);
  const auto deadline = Clock::now() + timeout;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      rc = ::poll(&p, 1, RemainingMs(deadline));
      int err = 0;
      socklen_t len = sizeof err;
      if (rc == 1) ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = (rc == 1 && err == 0) ? 0 : -1;
      errno = rc == 0 ? 0 : (err ? err : ETIMEDOUT);
    }
    if (rc != 0) {
      last = Status::IoError(Status::FromErrno(errno, "connecting to tcp:" + ep.host + ":" + std::to_string(ep.port)).message());
      ::close(fd);
      continue;
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    freeaddrinfo(res);
    return fd;
  }
  freeaddrinfo(res);
  return last;
}

void IgnoreSigpipe() {
  struct sigaction old {};
  if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
}

Result<std::shared_ptr<SSL_CTX>> MakeServerTlsContext(const std::string& cert_file, const std::string& key_file) {
  SSL_CTX* raw = SSL_CTX_new(TLS_server_method());
  if (!raw) return Status::IoError("SSL_CTX_new: " + SslErrors());
  std::shared_ptr<SSL_CTX> ctx(raw, SSL_CTX_free);
  SSL_CTX_set_min_proto_version(raw, TLS1_2_VERSION);
  if (SSL_CTX_use_certificate_chain_file(raw, cert_file.c_str()) != 1) {
    return Status::InvalidArgument("tls cert " + cert_file + ": " + SslErrors());
  }
  if (SSL_CTX_use_PrivateKey_file(raw, key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    return Status::InvalidArgument("tls key " + key_file + ": " + SslErrors());
  }
  if (SSL_CTX_check_private_key(raw) != 1) {
    return Status::InvalidArgument("tls key " + key_file + " does not match cert " + cert_file);
  }
  return ctx;
}

Result<std::shared_ptr<SSL_CTX>> MakeClientTlsContext(const std::string& ca_file, bool verify) {
  SSL_CTX* raw = SSL_CTX_new(TLS_client_method());
  if (!raw) return Status::IoError("SSL_CTX_new: " + SslErrors());
  std::shared_ptr<SSL_CTX> ctx(raw, SSL_CTX_free);
  SSL_CTX_set_min_proto_version(raw, TLS1_2_VERSION);
  if (verify) {
    SSL_CTX_set_verify(raw, SSL_VERIFY_PEER, nullptr);
    const int ok = ca_file.empty() ? SSL_CTX_set_default_verify_paths(raw) : SSL_CTX_load_verify_locations(raw, ca_file.c_str(), nullptr);
    if (ok != 1) return Status::InvalidArgument("tls CA file '" + ca_file + "': " + SslErrors());
  } else {
    SSL_CTX_set_verify(raw, SSL_VERIFY_NONE, nullptr);
  }
  return ctx;
}

Conn::Conn(int fd, bool unix_socket) : fd_(fd), unix_(unix_socket) {}

Conn::~Conn() {
  if (ssl_) SSL_free(ssl_);
  DropFds();
  if (fd_ >= 0) ::close(fd_);
}

static Status TlsHandshake(SSL* ssl, int fd, bool server, Clock::time_point deadline, const std::string& what) {
  // The socket is blocking; bound the handshake with socket timeouts.
  timeval tv{};
  const int ms = std::max(1, RemainingMs(deadline));
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  const int rc = server ? SSL_accept(ssl) : SSL_connect(ssl);
  if (rc != 1) return Status::PermissionDenied(what + ": TLS handshake failed: " + SslErrors());
  return Status::Ok();
}

Status Conn::TlsAccept(SSL_CTX* ctx, Clock::time_point deadline) {
  ssl_ = SSL_new(ctx);
  if (!ssl_) return Status::IoError("SSL_new: " + SslErrors());
  SSL_set_fd(ssl_, fd_);
  return TlsHandshake(ssl_, fd_, true, deadline, "accepting");
}

Status Conn::TlsConnect(SSL_CTX* ctx, const std::string& server_name, Clock::time_point deadline) {
  ssl_ = SSL_new(ctx);
  if (!ssl_) return Status::IoError("SSL_new: " + SslErrors());
  SSL_set_fd(ssl_, fd_);
  if (!server_name.empty()) {
    SSL_set_tlsext_host_name(ssl_, server_name.c_str());
    if (SSL_get_verify_mode(ssl_) & SSL_VERIFY_PEER) {
      in_addr a4{};
      if (inet_pton(AF_INET, server_name.c_str(), &a4) == 1) {
        X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_), server_name.c_str());
      } else {
        SSL_set1_host(ssl_, server_name.c_str());
      }
    }
  }
  return TlsHandshake(ssl_, fd_, false, deadline, "connecting to " + server_name);
}

Status Conn::WaitFor(short events, Clock::time_point deadline, bool unbounded) {
  for (;;) {
    pollfd p{fd_, events, 0};
    const int rc = ::poll(&p, 1, unbounded ? -1 : RemainingMs(deadline));
    if (rc > 0) return Status::Ok();
    if (rc == 0) return Deadline(events == POLLIN ? "reading from the peer" : "writing to the peer");
    if (errno != EINTR) return Status::FromErrno(errno, "poll");
  }
}

static void SetTimeouts(int fd, Clock::time_point deadline, bool unbounded) {
  timeval tv{};
  if (!unbounded) {
    const int ms = std::max(1, RemainingMs(deadline));
    tv.tv_sec = ms / 1000;
    tv.tv_usec = (ms % 1000) * 1000;
  }
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

Result<size_t> Conn::ReadSome(void* buf, size_t n, Clock::time_point deadline, bool unbounded) {
  iovec iov{buf, n};
  if (ssl_) {
    if (SSL_pending(ssl_) == 0) FLATKV_RETURN_IF_ERROR(WaitFor(POLLIN, deadline, unbounded));
    SetTimeouts(fd_, deadline, unbounded);
    int rc, err;
    do {
      errno = 0;
      rc = SSL_read(ssl_, buf, static_cast<int>(std::min<size_t>(n, INT_MAX)));
      err = rc > 0 ? SSL_ERROR_NONE : SSL_get_error(ssl_, rc);
    } while (err == SSL_ERROR_SYSCALL && errno == EINTR);
    if (rc > 0) return static_cast<size_t>(rc);
    if (err == SSL_ERROR_ZERO_RETURN) return size_t{0};
    if (err == SSL_ERROR_SYSCALL && errno == 0) return size_t{0};
    if (err == SSL_ERROR_SYSCALL && (errno == EAGAIN || errno == EWOULDBLOCK)) return Deadline("reading from the peer");
    return Status::IoError("TLS read: " + SslErrors());
  }
  if (!unbounded) FLATKV_RETURN_IF_ERROR(WaitFor(POLLIN, deadline, false));
  return ReadSomeV(&iov, 1, deadline);
}

void Conn::KeepFds(msghdr& msg) {
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < nfd; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      fds_.push_back(fd);
    }
  }
}

Result<size_t> Conn::ReadSomeV(iovec* iov, int cnt, Clock::time_point deadline) {
  for (;;) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(std::min(cnt, IOV_MAX));
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
    if (unix_) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
    }
    const ssize_t rc = ::recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC);
    if (rc < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        FLATKV_RETURN_IF_ERROR(WaitFor(POLLIN, deadline, false));
        continue;
      }
      return Status::IoError(Status::FromErrno(errno, "reading from the peer").message());
    }
    if (unix_) KeepFds(msg);
    return static_cast<size_t>(rc);
  }
}

size_t Conn::FromBuffer(void* dst, size_t n) {
  const size_t k = std::min(n, rend_ - rpos_);
  if (k) {
    std::memcpy(dst, rbuf_.data() + rpos_, k);
    rpos_ += k;
  }
  return k;
}

Status Conn::ReadFull(void* buf, size_t n, Clock::time_point deadline, bool idle_ok) {
  auto* p = static_cast<std::byte*>(buf);
  size_t got = FromBuffer(p, n);
  while (got < n) {
    const bool direct = n - got >= kBufferBytes / 2;
    if (!direct && rbuf_.empty()) rbuf_.resize(kBufferBytes);
    std::byte* into = direct ? p + got : rbuf_.data();
    FLATKV_ASSIGN_OR_RETURN(size_t k, ReadSome(into, direct ? n - got : rbuf_.size(), deadline, idle_ok && got == 0));
    if (k == 0) {
      if (got == 0) return Status::Aborted("closed");
      return Status::IoError("the peer closed the connection mid-frame (" + std::to_string(got) + " of " +
                             std::to_string(n) + " bytes)");
    }
    if (direct) {
      got += k;
    } else {
      rpos_ = 0;
      rend_ = k;
      got += FromBuffer(p + got, n - got);
    }
  }
  return Status::Ok();
}

Result<size_t> Conn::ReadAvailable(void* buf, size_t n, Clock::time_point deadline) {
  if (n == 0) return size_t{0};
  if (const size_t k = FromBuffer(buf, n)) return k;
  return ReadSome(buf, n, deadline, false);
}

Status Conn::ReadV(std::span<iovec> iov_in, Clock::time_point deadline) {
  std::vector<iovec> iov(iov_in.begin(), iov_in.end());
  size_t i = 0;
  while (i < iov.size() && rpos_ < rend_) {  // buffered bytes first
    const size_t k = FromBuffer(iov[i].iov_base, iov[i].iov_len);
    iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + k;
    iov[i].iov_len -= k;
    if (iov[i].iov_len == 0) ++i;
  }
  while (i < iov.size()) {
    if (iov[i].iov_len == 0) {
      ++i;
      continue;
    }
    size_t k;
    if (ssl_) {
      FLATKV_ASSIGN_OR_RETURN(k, ReadSome(iov[i].iov_base, iov[i].iov_len, deadline, false));
    } else {
      FLATKV_RETURN_IF_ERROR(WaitFor(POLLIN, deadline, false));
      FLATKV_ASSIGN_OR_RETURN(k, ReadSomeV(&iov[i], static_cast<int>(iov.size() - i), deadline));
    }
    if (k == 0) return Status::IoError("the peer closed the connection mid-frame");
    while (k > 0) {
      const size_t take = std::min(k, iov[i].iov_len);
      iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + take;
      iov[i].iov_len -= take;
      k -= take;
      if (iov[i].iov_len == 0) ++i;
    }
  }
  return Status::Ok();
}

Status Conn::WriteV(std::span<const iovec> iov_in, Clock::time_point deadline) {
  std::vector<iovec> iov(iov_in.begin(), iov_in.end());
  size_t i = 0;
  while (i < iov.size()) {
    if (iov[i].iov_len == 0) {
      ++i;
      continue;
    }
    size_t k;
    if (ssl_) {
      SetTimeouts(fd_, deadline, false);
      errno = 0;
      const int rc = SSL_write(ssl_, iov[i].iov_base, static_cast<int>(std::min<size_t>(iov[i].iov_len, INT_MAX)));
      if (rc <= 0 && SSL_get_error(ssl_, rc) == SSL_ERROR_SYSCALL && errno == EINTR) continue;
      if (rc <= 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return Deadline("writing to the peer");
        return Status::IoError("TLS write: " + SslErrors());
      }
      k = static_cast<size_t>(rc);
    } else {
      msghdr msg{};
      msg.msg_iov = &iov[i];
      msg.msg_iovlen = std::min<size_t>(iov.size() - i, IOV_MAX);
      const ssize_t rc = ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (rc < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          FLATKV_RETURN_IF_ERROR(WaitFor(POLLOUT, deadline, false));
          continue;
        }
        return Status::IoError(Status::FromErrno(errno, "writing to the peer").message());
      }
      k = static_cast<size_t>(rc);
    }
    while (k > 0) {
      const size_t take = std::min(k, iov[i].iov_len);
      iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + take;
      iov[i].iov_len -= take;
      k -= take;
      if (iov[i].iov_len == 0) ++i;
    }
  }
  return Status::Ok();
}

Status Conn::Write(std::span<const std::byte> a, Clock::time_point deadline) {
  iovec v{const_cast<std::byte*>(a.data()), a.size()};
  return WriteV({&v, 1}, deadline);
}

Status Conn::Write(std::span<const std::byte> a, std::span<const std::byte> b, Clock::time_point deadline) {
  iovec v[2] = {{const_cast<std::byte*>(a.data()), a.size()}, {const_cast<std::byte*>(b.data()), b.size()}};
  return WriteV(v, deadline);
}

Status Conn::WriteWithFd(std::span<const std::byte> frame, int fd, Clock::time_point deadline) {
  if (!unix_ || ssl_) return Status::NotSupported("passing a file descriptor needs a unix: connection");
  iovec v{const_cast<std::byte*>(frame.data()), frame.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &v;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  FLATKV_RETURN_IF_ERROR(WaitFor(POLLOUT, deadline, false));
  ssize_t rc;
  do {
    rc = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
  } while (rc < 0 && errno == EINTR);
  if (rc < 0) return Status::IoError(Status::FromErrno(errno, "sending a file descriptor").message());
  if (static_cast<size_t>(rc) < frame.size()) {
    return Write(frame.subspan(static_cast<size_t>(rc)), deadline);
  }
  return Status::Ok();
}

Result<size_t> Conn::FillBuffer() {
  if (rbuf_.empty()) rbuf_.resize(kBufferBytes);
  if (rpos_ == rend_) {
    rpos_ = rend_ = 0;
  } else if (rpos_ > 0) {
    std::memmove(rbuf_.data(), rbuf_.data() + rpos_, rend_ - rpos_);
    rend_ -= rpos_;
    rpos_ = 0;
  }
  drained_ = false;
  if (rend_ == rbuf_.size()) return size_t{0};
  for (;;) {
    iovec iov{rbuf_.data() + rend_, rbuf_.size() - rend_};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
    if (unix_) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
    }
    const ssize_t rc = ::recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (rc < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::Aborted("would block");
      return Status::IoError(Status::FromErrno(errno, "reading from the peer").message());
    }
    if (unix_) KeepFds(msg);
    drained_ = rc > 0 && static_cast<size_t>(rc) < iov.iov_len && msg.msg_controllen == 0 && !(msg.msg_flags & MSG_CTRUNC);
    rend_ += static_cast<size_t>(rc);
    return static_cast<size_t>(rc);
  }
}

Result<size_t> Conn::WriteNow(std::span<const std::byte> a) {
  for (;;) {
    const ssize_t rc = ::send(fd_, a.data(), a.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (rc >= 0) return static_cast<size_t>(rc);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
    return Status::IoError(Status::FromErrno(errno, "writing to the peer").message());
  }
}

int Conn::TakeFd() {
  if (fds_.empty()) return -1;
  const int fd = fds_.front();
  fds_.erase(fds_.begin());
  return fd;
}

void Conn::DropFds() {
  for (int fd : fds_) ::close(fd);
  fds_.clear();
}

bool Conn::Buffered() const { return rpos_ < rend_ || (ssl_ != nullptr && SSL_pending(ssl_) > 0); }

void Conn::Shutdown() { ::shutdown(fd_, SHUT_RD); }

}  // namespace flatkv::net
