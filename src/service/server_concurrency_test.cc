// Many clients at once against one daemon: each thread has its own
// connection and tenant-local chains, puts, looks up and restores them over
// both paths while the others do the same; then the server stops with
// clients still connected. Run under ThreadSanitizer in CI.
#include <gtest/gtest.h>

#include <dirent.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "service/test_server.h"

namespace flatkv::service {
namespace {

using flatkv::testing::ChainKeys;
using flatkv::testing::TempDir;
using namespace flatkv::service::testing;

TEST(ServerConcurrencyTest, ClientsInParallelThenStopWithClientsConnected) {
  TempDir dir;
  auto server = StartServer(SmallServerConfig(dir.path()));
  ASSERT_NE(server, nullptr);
  constexpr int kThreads = 6, kRounds = 4;
  std::atomic<int> failures{0};
  std::vector<std::unique_ptr<Client>> clients(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    clients[t] = ConnectOrNull(t % 2 ? server->unix_address() : server->tcp_address(), t % 3 ? kTokenA : kTokenB);
    ASSERT_NE(clients[t], nullptr);
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Client& c = *clients[t];
      const uint64_t bb = c.info().block_bytes;
      auto window = t % 2 ? c.RegisterShmWindow(4 * bb) : Result<ShmWindow>(Status::NotSupported("tcp"));
      for (int r = 0; r < kRounds; ++r) {
        const uint64_t id = 10000 + t * 100 + r;
        auto keys = ChainKeys(id, 3);
        auto data = Blocks(bb, 3, id);
        if (!c.Put(t, keys, data, r % 2 ? PutHint::kOneShot : PutHint::kAuto).ok()) failures++;
        auto hit = c.Lookup(keys);
        if (!hit.ok() || *hit != 3) failures++;
        std::vector<std::byte> out(data.size());
        auto res = c.Restore(keys, out);
        if (!res.ok() || res->valid_blocks != 3 || std::memcmp(out.data(), data.data(), data.size()) != 0) failures++;
        if (window.ok()) {
          auto s = c.RestoreToShm(*window, 0, keys);
          if (!s.ok() || s->valid_blocks != 3) failures++;
        }
      }
      if (!c.StatsJson().ok()) failures++;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_NE(server->PrometheusText().find("flatkv_tenant_requests_total{tenant=\"1\",kind=\"restore\"}"),
            std::string::npos);
  // Stop with every connection still open and idle: they are closed, the store is closed.
  EXPECT_TRUE(server->Stop().ok());
  for (auto& c : clients) EXPECT_FALSE(c->Health().ok());
}

// Threads in this process (/proc/self/task).
int ThreadCount() {
  DIR* d = ::opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n;
}

TEST(ServerConcurrencyTest, IdleConnectionsCostNoThreads) {
  TempDir dir;
  ServerConfig c = SmallServerConfig(dir.path());
  c.loop_threads = 2;
  c.workers = 2;
  auto server = StartServer(c);
  ASSERT_NE(server, nullptr);
  const int before = ThreadCount();
  ASSERT_GT(before, 0);
  // 64 logged-in connections, each with a lookup answered and a put (a
  // worker's) done, then idle: the event loops hold them, not threads.
  std::vector<std::unique_ptr<Client>> clients;
  auto keys = ChainKeys(77, 1);
  for (int i = 0; i < 64; ++i) {
    clients.push_back(ConnectOrNull(i % 2 ? server->unix_address() : server->tcp_address(), i % 3 ? kTokenA : kTokenB));
    ASSERT_NE(clients.back(), nullptr);
    ASSERT_TRUE(clients.back()->Lookup(keys).ok());
  }
  auto data = Blocks(clients[0]->info().block_bytes, 1, 77);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(clients[i]->Put(i, keys, data, PutHint::kAuto).ok());
  EXPECT_TRUE(WaitFor([&] { return server->metrics().connections_active.load() == 64; }));
  const int after = ThreadCount();
  EXPECT_LE(after - before, 8) << before << " threads before 64 connections, " << after << " with them";
  for (auto& cl : clients) EXPECT_EQ(*cl->Lookup(keys), 1u);
}

}  // namespace
}  // namespace flatkv::service
