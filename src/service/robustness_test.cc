// The daemon under hostile or failing clients: malformed and oversized
// frames, a client that disconnects mid-transfer, a slow client, and a
// kill -9 under load followed by a restart.
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "service/test_server.h"
#include "service/wire.h"

namespace flatkv::service {
namespace {

using flatkv::testing::ChainKeys;
using flatkv::testing::TempDir;
using namespace flatkv::service::testing;

TEST(RobustnessTest, MalformedAndOversizedFramesGetErrorsNotCrashes) {
  TempDir dir;
  auto server = StartServer(SmallServerConfig(dir.path()));
  ASSERT_NE(server, nullptr);
  wire::Header h;
  std::vector<std::byte> p;

  // Not our protocol at all: an error frame, then the connection closes.
  int fd = RawConnect(server->tcp_address());
  const std::string http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(::send(fd, http.data(), http.size(), MSG_NOSIGNAL), static_cast<ssize_t>(http.size()));
  ASSERT_TRUE(ReadRaw(fd, &h, &p));
  EXPECT_EQ(h.type, wire::Type::kError);
  EXPECT_NE(wire::ErrorStatus(p).message().find("bad magic"), std::string::npos);
  EXPECT_TRUE(ClosedByPeer(fd));
  ::close(fd);

  // A request before hello.
  fd = RawConnect(server->tcp_address());
  ASSERT_TRUE(SendAll(fd, wire::EncodeEmpty(wire::Type::kPing, 5)));
  ASSERT_TRUE(ReadRaw(fd, &h, &p));
  EXPECT_EQ(wire::ErrorStatus(p).code(), Code::kFailedPrecondition);
  EXPECT_TRUE(ClosedByPeer(fd));
  ::close(fd);

  // An oversized frame: refused from its header, before its payload is read.
  fd = RawHello(server->tcp_address(), kTokenA);
  ASSERT_GE(fd, 0);
  std::byte head[wire::kHeaderBytes];
  wire::EncodeHeader({wire::Type::kPut, 9, static_cast<uint32_t>(server->config().max_frame_bytes + 1)}, head);
  ASSERT_EQ(::send(fd, head, sizeof head, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof head));
  ASSERT_TRUE(ReadRaw(fd, &h, &p));
  EXPECT_NE(wire::ErrorStatus(p).message().find("exceeds the limit"), std::string::npos);
  EXPECT_TRUE(ClosedByPeer(fd));
  ::close(fd);

  // A well-framed but malformed payload: an error, and the connection stays usable.
  fd = RawHello(server->tcp_address(), kTokenA);
  ASSERT_GE(fd, 0);
  wire::Lookup lookup;
  lookup.keys = ChainKeys(1, 3);
  auto frame = wire::EncodeLookup(10, lookup);
  frame.resize(frame.size() - 8);  // truncate the last key
  wire::EncodeHeader({wire::Type::kLookup, 10, static_cast<uint32_t>(frame.size() - wire::kHeaderBytes)}, frame.data());
  ASSERT_TRUE(SendAll(fd, frame));
  ASSERT_TRUE(ReadRaw(fd, &h, &p));
  EXPECT_EQ(h.request_id, 10u);
  EXPECT_EQ(wire::ErrorStatus(p).code(), Code::kInvalidArgument);
  // A retain with no payload is refused by name, and the connection stays.
  ASSERT_TRUE(SendAll(fd, wire::EncodeEmpty(wire::Type::kRetain, 11)));
  ASSERT_TRUE(ReadRaw(fd, &h, &p));
  EXPECT_EQ(wire::ErrorStatus(p).code(), Code::kInvalidArgument);
  EXPECT_NE(wire::ErrorStatus(p).message().find("retain"), std::string::npos) << wire::ErrorStatus(p).message();
  // A put whose payload does not match its key count.
  wire::Put put;
  put.keys = ChainKeys(1, 2);
  auto put_frame = wire::EncodePutHead(12, put, 100);
  put_frame.resize(put_frame.size() + 100);
  ASSERT_TRUE(SendAll(fd, put_frame));
  ASSERT_TRUE(ReadRaw(fd, &h, &p));
  EXPECT_EQ(wire::ErrorStatus(p).code(), Code::kInvalidArgument);
  ASSERT_TRUE(SendAll(fd, wire::EncodeEmpty(wire::Type::kPing, 13)));
  ASSERT_TRUE(ReadRaw(fd, &h, &p));
  EXPECT_EQ(h.type, wire::Type::kPong);
  ::close(fd);
  EXPECT_GE(server->metrics().frame_errors.load(), 4u);
  auto client = ConnectOrNull(server->unix_address(), kTokenA);
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(client->Health().ok());
}

TEST(RobustnessTest, ClientDisconnectingMidTransferLeavesTheServerServing) {
  TempDir dir;
  auto server = StartServer(SmallServerConfig(dir.path()));
  ASSERT_NE(server, nullptr);
  auto a = ConnectOrNull(server->unix_address(), kTokenA);
  auto keys = ChainKeys(5, 24);
  auto data = Blocks(a->info().block_bytes, keys.size(), 5);
  ASSERT_TRUE(a->Put(0, keys, data, PutHint::kOneShot).ok());
  for (int round = 0; round < 3; ++round) {
    // A raw client asks for a restore, reads a little, and vanishes.
    int fd = RawHello(server->tcp_address(), kTokenA);
    ASSERT_GE(fd, 0);
    wire::Restore r;
    r.keys = keys;
    ASSERT_TRUE(SendAll(fd, wire::EncodeRestore(2, r)));
    char some[100];
    const ssize_t got = Recv(fd, some, sizeof some, MSG_WAITALL);
    ASSERT_GT(got, 0) << "round " << round << ": " << std::strerror(errno);
    ::close(fd);
  }
  // The library client abandoning a restore from its callback.
  auto quitter = ConnectOrNull(server->unix_address(), kTokenA);
  auto st = quitter->RestoreLayers(keys, [](uint32_t layer, uint32_t, std::span<const std::byte>) {
    return layer == 1 ? Status::Aborted("caller gave up") : Status::Ok();
  });
  EXPECT_EQ(st.status().code(), Code::kAborted);
  EXPECT_FALSE(quitter->Health().ok());  // the stream is unread: the connection is gone
  quitter.reset();
  EXPECT_TRUE(WaitFor([&] { return server->metrics().connections_active.load() == 1; }));
  std::vector<std::byte> out(data.size());
  auto res = a->Restore(keys, out);
  ASSERT_TRUE(res.ok());
  EXPECT_EQ(res->valid_blocks, 24u);
  EXPECT_EQ(0, std::memcmp(out.data(), data.data(), data.size()));
}

TEST(RobustnessTest, SlowClientDoesNotBlockOthersAndIsDropped) {
  TempDir dir;
  ServerConfig c = SmallServerConfig(dir.path());
  c.io_timeout = std::chrono::milliseconds(300);
  auto server = StartServer(c);
  ASSERT_NE(server, nullptr);
  auto a = ConnectOrNull(server->unix_address(), kTokenA);
  auto keys = ChainKeys(6, 48);  // 3.75 MiB: more than the socket buffers hold
  auto data = Blocks(a->info().block_bytes, keys.size(), 6);
  ASSERT_TRUE(a->Put(0, keys, data, PutHint::kOneShot).ok());
  int slow = RawHello(server->tcp_address(), kTokenA);
  ASSERT_GE(slow, 0);
  int small = 4096;
  ::setsockopt(slow, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  wire::Restore r;
  r.keys = keys;
  // Requests for 8 x 3.75 MiB, never read: more than loopback TCP's socket
  // buffers can absorb even after they autotune (the small SO_RCVBUF comes
  // after the handshake, so the window may already be large).
  for (uint32_t id = 2; id < 10; ++id) ASSERT_TRUE(SendAll(slow, wire::EncodeRestore(id, r)));
  // Everyone else proceeds meanwhile, restores included.
  for (int i = 0; i < 20; ++i) ASSERT_EQ(*a->Lookup(keys), 48u);
  std::vector<std::byte> out(data.size());
  ASSERT_TRUE(a->Restore(keys, out).ok());
  EXPECT_EQ(0, std::memcmp(out.data(), data.data(), data.size()));
  // The stalled connection is dropped after io_timeout.
  EXPECT_TRUE(WaitFor([&] { return server->metrics().connections_active.load() == 1; }));
  ::close(slow);
}

// Runs a daemon in a forked child until it is killed.
pid_t ForkServer(const ServerConfig& c) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  auto server = StartServer(c);
  if (!server) ::_exit(3);
  for (;;) ::pause();
}

TEST(RobustnessTest, KillNineUnderLoadThenRestartServesOnlyCorrectBlocks) {
  TempDir dir;
  ServerConfig c = SmallServerConfig(dir.path());
  c.tcp_address.clear();
  c.http_address.clear();
  const pid_t child = ForkServer(c);
  ASSERT_GT(child, 0);
  std::unique_ptr<Client> client;
  ASSERT_TRUE(WaitFor([&] {
    client = ConnectOrNull(c.unix_path, kTokenA, /*quiet=*/true);
    return client != nullptr;
  }));
  const uint64_t bb = client->info().block_bytes;
  constexpr int kChains = 40;
  std::atomic<int> acked{0};
  std::thread writer([&] {
    for (int i = 0; i < kChains; ++i) {
      auto keys = ChainKeys(1000 + i, 3);
      if (!client->Put(i, keys, Blocks(bb, 3, 1000 + i), PutHint::kOneShot).ok()) return;
      acked.store(i + 1);
    }
  });
  ASSERT_TRUE(WaitFor([&] { return acked.load() >= 8; }));
  ::kill(child, SIGKILL);  // while puts are still arriving
  writer.join();
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  const int survived_acks = acked.load();
  client.reset();

  auto server = StartServer(c);  // restarts on the same directory and socket path
  ASSERT_NE(server, nullptr);
  auto again = ConnectOrNull(c.unix_path, kTokenA);
  ASSERT_NE(again, nullptr);
  for (int i = 0; i < kChains; ++i) {
    auto keys = ChainKeys(1000 + i, 3);
    auto want = Blocks(bb, 3, 1000 + i);
    std::vector<std::byte> out(want.size());
    auto r = again->Restore(keys, out);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (i < survived_acks) {
      EXPECT_EQ(r->valid_blocks, 3u) << "acknowledged chain " << i << " lost";
    }
    // Whatever is served is exactly what was put.
    EXPECT_EQ(0, std::memcmp(out.data(), want.data(), r->valid_blocks * bb)) << "chain " << i;
  }
}

}  // namespace
}  // namespace flatkv::service
