// Helpers for the service tests: a small daemon on a temporary directory
// (stories260K-shaped blocks of 16 KiB per layer), listening on a Unix
// socket, an ephemeral TCP port and an ephemeral HTTP port.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "service/client.h"
#include "service/config.h"
#include "service/server.h"
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

}  // namespace flatkv::service::testing
