// The daemon's secure defaults and resource limits (docs/service.md,
// "Limits"): every limit is tried by a test that passes it.
#include <fcntl.h>
#include <malloc.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "service/test_server.h"
#include "service/wire.h"

namespace flatkv::service {
namespace {

using flatkv::testing::ChainKeys;
using flatkv::testing::TempDir;
using namespace flatkv::service::testing;

int RawUnixConnect(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::strncpy(sa.sun_path, path.c_str(), sizeof sa.sun_path - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

TEST(LimitsTest, UnixSocketIsOwnerOnlyInAPrivateDirectory) {
  TempDir dir;
  ServerConfig c = SmallServerConfig(dir.path());
  c.unix_path = dir.Sub("run/flatkv.sock");  // a directory that does not exist yet
  auto server = StartServer(c);
  ASSERT_NE(server, nullptr);
  struct stat st {};
  ASSERT_EQ(::stat(dir.Sub("run").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  ASSERT_EQ(::stat(c.unix_path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u) << std::oct << (st.st_mode & 0777);
  server.reset();

  // A directory others can write to is refused, saying what to do.
  ASSERT_EQ(::mkdir(dir.Sub("shared").c_str(), 0700), 0);
  ASSERT_EQ(::chmod(dir.Sub("shared").c_str(), 0777), 0);
  c.unix_path = dir.Sub("shared/flatkv.sock");
  ASSERT_TRUE(FinalizeConfig(&c).ok());
  auto refused = Server::Start(c);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("has mode 0777: group or others can write there; chmod 0700"), std::string::npos)
      << refused.status().ToString();
}

TEST(LimitsTest, StartRefusesTcpWithoutTenantsEvenUnfinalized) {
  TempDir dir;
  ServerConfig c = SmallServerConfig(dir.path());
  c.tenants.clear();
  ASSERT_FALSE(FinalizeConfig(&c).ok());
  auto s = Server::Start(c);  // a caller that skipped FinalizeConfig
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("needs at least one [[tenants]] entry"), std::string::npos) << s.status().ToString();
  // Without TCP, the implicit tenant serves the Unix socket.
  c.tcp_address.clear();
  auto server = StartServer(c);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->tcp_address(), "");
  EXPECT_NE(ConnectOrNull(server->unix_address(), ""), nullptr);
}

TEST(LimitsTest, UnauthenticatedConnectionsAreCappedPerPeer) {
  TempDir dir;
  ServerConfig c = SmallServerConfig(dir.path());
  c.max_unauthenticated_per_peer = 2;
  auto server = StartServer(c);
  ASSERT_NE(server, nullptr);
  // Two silent connections from 127.0.0.1 use its allowance...
  int idle1 = RawConnect(server->tcp_address()), idle2 = RawConnect(server->tcp_address());
  ASSERT_GE(idle1, 0);
  ASSERT_GE(idle2, 0);
  ASSERT_TRUE(WaitFor([&] { return server->metrics().connections_active.load() == 2; }));
  // ...so a third is refused at accept, with a message naming the limit.
  int third = RawConnect(server->tcp_address());
  wire::Header h;
  std::vector<std::byte> p;
  ASSERT_TRUE(ReadRaw(third, &h, &p));
  EXPECT_EQ(h.type, wire::Type::kError);
  EXPECT_NE(wire::ErrorStatus(p).message().find("limits.max_unauthenticated_per_peer = 2"), std::string::npos)
      << wire::ErrorStatus(p).ToString();
  EXPECT_TRUE(ClosedByPeer(third));
  ::close(third);
  // The Unix socket counts its peer (this uid) separately.
  auto unix_client = ConnectOrNull(server->unix_address(), kTokenA);
  EXPECT_NE(unix_client, nullptr);
  // Once one of them logs in, there is room again.
  wire::Hello hello;
  hello.token = kTokenA;
  ASSERT_TRUE(SendAll(idle1, wire::EncodeHello(1, hello)));
  ASSERT_TRUE(ReadRaw(idle1, &h, &p));
  EXPECT_EQ(h.type, wire::Type::kHelloOk);
  EXPECT_NE(ConnectOrNull(server->tcp_address(), kTokenB), nullptr);
  ::close(idle1);
  ::close(idle2);
}

TEST(LimitsTest, ConnectionsThatDoNotLogInTimeOutQuickly) {
  TempDir dir;
  ServerConfig c = SmallServerConfig(dir.path());
  c.login_timeout = std::chrono::milliseconds(200);
  c.io_timeout = std::chrono::milliseconds(10000);  // the login timeout, not this, must close it
  auto server = StartServer(c);
  ASSERT_NE(server, nullptr);
  for (const bool unix_socket : {false, true}) {
    const auto start = std::chrono::steady_clock::now();
    int fd = unix_socket ? RawUnixConnect(c.unix_path) : RawConnect(server->tcp_address());
    ASSERT_GE(fd, 0);
    // Half a hello, then nothing.
    wire::Hello hello;
    hello.token = kTokenA;
    auto frame = wire::EncodeHello(1, hello);
    frame.resize(frame.size() / 2);
    ASSERT_TRUE(SendAll(fd, frame));
    EXPECT_TRUE(ClosedByPeer(fd));
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_GE(took, std::chrono::milliseconds(150));
    EXPECT_LT(took, std::chrono::milliseconds(3000));
    ::close(fd);
  }
  // A client that logs in is not bound by it between requests.
  auto a = ConnectOrNull(server->unix_address(), kTokenA);
  ASSERT_NE(a, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_TRUE(a->Health().ok());
}

// Bytes malloc has handed out (heap and mmapped chunks) in this process.
uint64_t AllocatedBytes() {
  const struct mallinfo2 mi = ::mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

TEST(LimitsTest, OversizedFrameHeaderFloodKeepsMemoryBounded) {
  TempDir dir;
  ServerConfig c = SmallServerConfig(dir.path());
  c.io_timeout = std::chrono::milliseconds(20000);  // the connections stay while we measure
  auto server = StartServer(c);
  ASSERT_NE(server, nullptr);
  constexpr int kConnections = 32;
  std::vector<int> fds;
  for (int i = 0; i < kConnections; ++i) {
    fds.push_back(RawHello(server->tcp_address(), i % 2 ? kTokenA : kTokenB));
    ASSERT_GE(fds.back(), 0);
  }
  const uint64_t before = AllocatedBytes();
  // Each claims a put of max_frame_bytes (64 MiB) and sends 100 bytes of it:
  // 2 GiB if the daemon believed the headers.
  std::vector<std::byte> frame(wire::kHeaderBytes + 100);
  wire::EncodeHeader({wire::Type::kPut, 2, static_cast<uint32_t>(c.max_frame_bytes)}, frame.data());
  for (int fd : fds) ASSERT_TRUE(SendAll(fd, frame));
  ASSERT_TRUE(WaitFor([&] { return server->metrics().requests_in_flight.load() == 0; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // every connection is waiting for its payload
  const uint64_t grown = AllocatedBytes() - std::min(before, AllocatedBytes());
  EXPECT_LT(grown, 16ull << 20) << "32 headers of 64 MiB took " << grown << " bytes";
  for (int fd : fds) ::close(fd);
}

// A raw Unix connection that has logged in; nullptr on failure.
std::unique_ptr<net::Conn> UnixHello(const std::string& path, const std::string& token) {
  const int fd = RawUnixConnect(path);
  if (fd < 0) return nullptr;
  auto conn = std::make_unique<net::Conn>(fd, true);
  wire::Hello h;
  h.token = token;
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  std::vector<std::byte> p;
  if (!conn->Write(wire::EncodeHello(1, h), deadline).ok()) return nullptr;
  auto reply = ReadFrame(*conn, &p, 1 << 20, deadline);
  if (!reply.ok() || reply->type != wire::Type::kHelloOk) return nullptr;
  return conn;
}

// Registers `memfd` as a window of `bytes`; the reply's status.
Status RegisterRaw(net::Conn& conn, int memfd, uint64_t bytes) {
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  FLATKV_RETURN_IF_ERROR(conn.WriteWithFd(wire::EncodeRegisterShm(7, {bytes}), memfd, deadline));
  std::vector<std::byte> p;
  FLATKV_ASSIGN_OR_RETURN(wire::Header h, ReadFrame(conn, &p, 1 << 20, deadline));
  if (h.type == wire::Type::kError) return wire::ErrorStatus(p);
  return h.type == wire::Type::kShmOk ? Status::Ok() : Status::IoError("unexpected reply");
}

int SealedMemfd(uint64_t bytes, bool allocate) {
  const int fd = ::memfd_create("limits-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (allocate ? ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)) != 0 : ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    ::close(fd);
    return -1;
  }
  ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK);
  return fd;
}

TEST(LimitsTest, SparseMemfdIsRefusedAndWindowsAreCappedForTheDaemon) {
  TempDir dir;
  ServerConfig c = SmallServerConfig(dir.path());
  c.max_shm_bytes = 4 << 20;
  c.max_shm_total_bytes = 6 << 20;
  auto server = StartServer(c);
  ASSERT_NE(server, nullptr);
  auto a = UnixHello(c.unix_path, kTokenA);
  ASSERT_NE(a, nullptr);
  // Sparse: the daemon would fault in (and be charged for) every page it wrote.
  const int sparse = SealedMemfd(4 << 20, false);
  ASSERT_GE(sparse, 0);
  Status st = RegisterRaw(*a, sparse, 4 << 20);
  EXPECT_EQ(st.code(), Code::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("has 0 of its 4194304 bytes allocated; allocate them (fallocate)"), std::string::npos) << st.ToString();
  // Allocated, the same memfd is accepted.
  ASSERT_EQ(::posix_fallocate(sparse, 0, 4 << 20), 0);
  EXPECT_TRUE(RegisterRaw(*a, sparse, 4 << 20).ok());
  ::close(sparse);
  // Per connection: 4 MiB are all a's.
  const int more = SealedMemfd(1 << 20, true);
  st = RegisterRaw(*a, more, 1 << 20);
  EXPECT_EQ(st.code(), Code::kNoSpace);
  EXPECT_NE(st.message().find("limits.max_shm_bytes"), std::string::npos) << st.ToString();
  // For the daemon: 6 MiB, 4 of them a's, so b gets 2 and no more.
  auto b = ConnectOrNull(server->unix_address(), kTokenB);
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(b->RegisterShmWindow(2 << 20).ok());  // the client allocates its memfd
  auto refused = b->RegisterShmWindow(1 << 20);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kNoSpace);
  EXPECT_NE(refused.status().message().find("limits.max_shm_total_bytes"), std::string::npos) << refused.status().ToString();
  // When a leaves, its 4 MiB are free again.
  a.reset();
  EXPECT_TRUE(WaitFor([&] { return server->metrics().shm_bytes.load() == (2u << 20); }));
  EXPECT_TRUE(b->RegisterShmWindow(1 << 20).ok());
  ::close(more);
}

TEST(LimitsTest, ClientDeadlinesAreCappedByMaxDeadline) {
  TempDir dir;
  ServerConfig c = SmallServerConfig(dir.path());
  c.max_deadline = std::chrono::milliseconds(100);
  c.default_deadline = std::chrono::milliseconds(100);
  auto server = StartServer(c);
  ASSERT_NE(server, nullptr);
  ClientOptions o;
  o.token = kTokenA;
  o.deadline = std::chrono::milliseconds(60000);  // asks for a minute
  auto client = Client::Connect(server->unix_address(), o);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto keys = ChainKeys(3, 48);  // 768 KiB a layer: more than the socket holds
  ASSERT_TRUE((*client)->Put(0, keys, Blocks((*client)->info().block_bytes, keys.size(), 3), PutHint::kOneShot).ok());
  // A reader that takes 150 ms a layer passes the capped deadline within two layers.
  auto r = (*client)->RestoreLayers(keys, [](uint32_t, uint32_t, std::span<const std::byte>) {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    return Status::Ok();
  });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kAborted) << r.status().ToString();
  EXPECT_NE(r.status().message().find("deadline exceeded at layer"), std::string::npos) << r.status().ToString();
  EXPECT_GE(server->metrics().deadline_exceeded.load(), 1u);
}

TEST(LimitsTest, SlowReaderIsCutOffAndPinsAreBoundedPerTenant) {
  TempDir dir;
  ServerConfig c = SmallServerConfig(dir.path());
  const uint64_t bb = c.store.shape.BytesPerToken() * c.store.block_tokens;
  c.max_restore_time = std::chrono::milliseconds(400);
  c.io_timeout = std::chrono::milliseconds(20000);  // the restore limit, not this, cuts the reader off
  c.tenant_pinned_bytes = 48 * bb;                  // one restore of the chain below
  auto server = StartServer(c);
  ASSERT_NE(server, nullptr);
  auto a = ConnectOrNull(server->unix_address(), kTokenA);
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->info().block_bytes, bb);
  auto keys = ChainKeys(4, 48);  // 3.75 MiB
  auto data = Blocks(bb, keys.size(), 4);
  ASSERT_TRUE(a->Put(0, keys, data, PutHint::kOneShot).ok());
  const Tenant& ta = server->tenants().tenants()[0];
  ASSERT_EQ(ta.name, "a");

  // A reader that asks for the chain and never reads it.
  auto slow = UnixHello(c.unix_path, kTokenA);
  ASSERT_NE(slow, nullptr);
  int small = 4096;
  ::setsockopt(slow->fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  wire::Restore req;
  req.keys = keys;
  const auto sent = std::chrono::steady_clock::now();
  ASSERT_TRUE(slow->Write(wire::EncodeRestore(3, req), Clock::now() + std::chrono::seconds(1)).ok());
  ASSERT_TRUE(WaitFor([&] { return server->tenants().PinnedBytes(ta) == 48 * bb; }));

  // Meanwhile a's other restores would pass tenant_pinned_bytes...
  std::vector<std::byte> out(data.size());
  auto refused = a->Restore(keys, out);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kNoSpace);
  EXPECT_NE(refused.status().message().find("exceed limits.tenant_pinned_bytes"), std::string::npos) << refused.status().ToString();
  // ...while tenant b restores its own blocks.
  auto b = ConnectOrNull(server->unix_address(), kTokenB);
  ASSERT_NE(b, nullptr);
  auto bkeys = ChainKeys(5, 8);
  auto bdata = Blocks(bb, bkeys.size(), 5);
  ASSERT_TRUE(b->Put(0, bkeys, bdata, PutHint::kOneShot).ok());
  std::vector<std::byte> bout(bdata.size());
  ASSERT_TRUE(b->Restore(bkeys, bout).ok());
  EXPECT_EQ(bout, bdata);

  // The slow reader is cut off after max_restore_ms, and its pins go with it.
  ASSERT_TRUE(WaitFor([&] { return server->tenants().PinnedBytes(ta) == 0; }));
  const auto held = std::chrono::steady_clock::now() - sent;
  EXPECT_GE(held, std::chrono::milliseconds(350));
  EXPECT_LT(held, std::chrono::milliseconds(4000));
  ASSERT_TRUE(a->Restore(keys, out).ok());
  EXPECT_EQ(out, data);
}

TEST(LimitsTest, PartialPutRefundsOnlyWhatItDidNotStore) {
  TempDir dir;
  ServerConfig c = SmallServerConfig(dir.path());
  c.store = flatkv::testing::SmallOptions("", 4, 0);  // DRAM only: 4 extents of 4 blocks
  c.store.session_dram_share_bytes = c.store.dram_capacity_bytes;
  c.dram_bytes = c.store.dram_capacity_bytes;
  c.ssd_bytes = 0;
  c.tenants = {{"a", kTokenA, "", 100ull << 20}};  // a quota, so usage is accounted
  auto server = StartServer(c);
  ASSERT_NE(server, nullptr);
  Store& store = server->store();
  const uint64_t bb = store.BlockBytes();
  // Three extents held by a restore in flight: nothing can be evicted from them.
  auto held = ChainKeys(77, 12);
  ASSERT_TRUE(store.Put(77, held, Blocks(bb, 12, 77)).ok());
  auto restore = store.StartRestore(held);
  ASSERT_TRUE(restore.ok());

  auto a = ConnectOrNull(server->unix_address(), kTokenA);
  ASSERT_NE(a, nullptr);
  auto keys = ChainKeys(8, 8);
  Status st = a->Put(1, keys, Blocks(bb, keys.size(), 8), PutHint::kAuto);
  ASSERT_EQ(st.code(), Code::kNoSpace) << st.ToString();  // one extent's 4 blocks fit, the rest do not
  const uint32_t stored = *a->Lookup(keys);
  EXPECT_EQ(stored, 4u);
  const Tenant& ta = server->tenants().tenants()[0];
  EXPECT_EQ(server->tenants().UsedBytes(ta), stored * bb) << "the stored blocks stay charged; only the rest is refunded";
  (void)(*restore)->Finish();
}

}  // namespace
}  // namespace flatkv::service
