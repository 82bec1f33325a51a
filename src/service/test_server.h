// Helpers for the service tests: a small daemon on a temporary directory
// (stories260K-shaped blocks of 16 KiB per layer), listening on a Unix
// socket, an ephemeral TCP port and an ephemeral HTTP port.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "service/client.h"
#include "service/config.h"
#include "service/server.h"
#include "service/wire.h"
#include "testing/test_util.h"

namespace flatkv::service::testing {

inline constexpr const char* kTokenA = "tenant-a-token-0123456789";
inline constexpr const char* kTokenB = "tenant-b-token-9876543210";

// A finalized config for `dir`: two tenants (a, b), small store.
inline ServerConfig SmallServerConfig(const std::string& dir) {
  ServerConfig c;
  c.store = flatkv::testing::SmallOptions(dir + "/ssd", 16, 64);
  c.store.window_bytes = 1 << 20;
  c.store.use_direct_io = true;
  c.dram_bytes = c.store.dram_capacity_bytes;
  c.ssd_bytes = c.store.ssd_capacity_bytes;
  c.unix_path = dir + "/flatkv.sock";
  c.tcp_address = "127.0.0.1:0";
  c.http_address = "127.0.0.1:0";
  c.io_timeout = std::chrono::milliseconds(2000);
  c.tenants = {{"a", kTokenA, "", 0}, {"b", kTokenB, "", 0}};
  return c;
}

inline std::unique_ptr<Server> StartServer(ServerConfig c) {
  if (!FinalizeConfig(&c).ok()) return nullptr;
  auto s = Server::Start(c);
  if (!s.ok()) {
    std::fprintf(stderr, "Server::Start: %s\n", s.status().ToString().c_str());
    return nullptr;
  }
  return std::move(s).value();
}

inline std::unique_ptr<Client> ConnectOrNull(const std::string& address, const std::string& token, bool quiet = false) {
  ClientOptions o;
  o.token = token;
  o.deadline = std::chrono::milliseconds(5000);
  auto c = Client::Connect(address, o);
  if (!c.ok()) {
    if (!quiet) std::fprintf(stderr, "Client::Connect(%s): %s\n", address.c_str(), c.status().ToString().c_str());
    return nullptr;
  }
  return std::move(c).value();
}

// Deterministic payload of `blocks` blocks of `block_bytes`.
inline std::vector<std::byte> Blocks(uint64_t block_bytes, size_t blocks, uint64_t seed) {
  std::vector<std::byte> out(block_bytes * blocks);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 12345;
  for (size_t i = 0; i + 8 <= out.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(out.data() + i, &x, 8);
  }
  return out;
}

// A raw TCP connection to `tcp_address` ("tcp:127.0.0.1:port"), for
// sending hand-made frames. -1 on failure.
inline int RawConnect(const std::string& tcp_address) {
  const size_t colon = tcp_address.rfind(':');
  const int port = std::atoi(tcp_address.c_str() + colon + 1);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// recv() that retries when a signal interrupts it (socket calls with a
// timeout are not restarted automatically).
inline ssize_t Recv(int fd, void* buf, size_t n, int flags) {
  size_t got = 0;
  for (;;) {
    const ssize_t rc = ::recv(fd, static_cast<char*>(buf) + got, n - got, flags);
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return got ? static_cast<ssize_t>(got) : rc;
    got += static_cast<size_t>(rc);
    if (!(flags & MSG_WAITALL) || got == n) return static_cast<ssize_t>(got);
  }
}

inline bool SendAll(int fd, const std::vector<std::byte>& b) {
  return ::send(fd, b.data(), b.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(b.size());
}

// Reads one frame; false on EOF, timeout (5 s) or a bad header.
inline bool ReadRaw(int fd, wire::Header* h, std::vector<std::byte>* payload) {
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::byte head[wire::kHeaderBytes];
  const ssize_t got = Recv(fd, head, sizeof head, MSG_WAITALL);
  if (got != static_cast<ssize_t>(sizeof head)) {
    std::fprintf(stderr, "ReadRaw: header read returned %zd (%s)\n", got, got < 0 ? std::strerror(errno) : "short");
    return false;
  }
  auto parsed = wire::ParseHeader(head, 1ull << 30);
  if (!parsed.ok()) return false;
  *h = *parsed;
  payload->resize(h->payload_bytes);
  return h->payload_bytes == 0 || Recv(fd, payload->data(), payload->size(), MSG_WAITALL) == static_cast<ssize_t>(payload->size());
}

// True when the peer has closed (EOF, or a reset when it closed with our
// bytes unread, within 5 s).
inline bool ClosedByPeer(int fd) {
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char c;
  const ssize_t rc = Recv(fd, &c, 1, 0);
  return rc == 0 || (rc < 0 && errno == ECONNRESET);
}

// A raw TCP connection that has logged in with `token`; -1 on failure.
inline int RawHello(const std::string& tcp, const std::string& token) {
  const int fd = RawConnect(tcp);
  wire::Hello h;
  h.token = token;
  if (fd < 0 || !SendAll(fd, wire::EncodeHello(1, h))) {
    ADD_FAILURE() << "connecting or sending hello: " << std::strerror(errno);
    return -1;
  }
  wire::Header rh;
  std::vector<std::byte> p;
  if (!ReadRaw(fd, &rh, &p) || rh.type != wire::Type::kHelloOk) {
    ADD_FAILURE() << "no hello_ok: " << std::strerror(errno) << ", frame " << wire::TypeName(rh.type);
    ::close(fd);
    return -1;
  }
  return fd;
}

// Polls `cond` every 10 ms for up to 5 s.
inline bool WaitFor(const std::function<bool()>& cond) {
  for (int i = 0; i < 500; ++i) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

}  // namespace flatkv::service::testing
