// The daemon end to end through the client: put, lookup and both restore
// paths over Unix and TCP, tenants (isolation, quotas, bad tokens), HTTP
// observability, and a warm restart.
#include "service/server.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <thread>

#include "service/test_server.h"

namespace flatkv::service {
namespace {

using flatkv::testing::ChainKeys;
using flatkv::testing::TempDir;
using namespace flatkv::service::testing;

// Put's layout -> the shared-memory window's layer-major layout.
std::vector<std::byte> LayerMajor(const std::vector<std::byte>& block_major, uint32_t layers, uint64_t lb, size_t n) {
  std::vector<std::byte> out(block_major.size());
  for (size_t b = 0; b < n; ++b)
    for (uint32_t l = 0; l < layers; ++l)
      std::memcpy(out.data() + (l * n + b) * lb, block_major.data() + (b * layers + l) * lb, lb);
  return out;
}

// `headers`: extra header lines, each ending in "\r\n".
std::string HttpGet(const std::string& hostport, const std::string& path, const std::string& headers = "") {
  const int fd = RawConnect("tcp:" + hostport);
  if (fd < 0) return "";
  const std::string req = "GET " + path + " HTTP/1.0\r\n" + headers + "\r\n";
  if (::write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) return "";
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

// `path` fetched until its body contains `needle` (up to 5 s): a request's
// latency is recorded after its last reply byte is sent, so the client can
// see the reply a moment before the histogram counts it.
std::string HttpGetUntil(const std::string& hostport, const std::string& path, const std::string& needle) {
  std::string out;
  for (int i = 0; i < 500; ++i) {
    out = HttpGet(hostport, path);
    if (out.find(needle) != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return out;
}

TEST(ServerTest, PutLookupRestoreOverEveryPath) {
  TempDir dir;
  auto server = StartServer(SmallServerConfig(dir.path()));
  ASSERT_NE(server, nullptr);
  for (const std::string& addr : {server->unix_address(), server->tcp_address()}) {
    SCOPED_TRACE(addr);
    auto client = ConnectOrNull(addr, kTokenA);
    ASSERT_NE(client, nullptr);
    const ServerInfo& info = client->info();
    EXPECT_EQ(info.tenant, "a");
    EXPECT_EQ(info.shape.layers, 5u);
    EXPECT_EQ(info.block_layer_bytes, 16384u);
    const uint64_t chain_id = addr[0] == 'u' ? 1 : 2;
    auto keys = ChainKeys(chain_id, 6);
    auto data = Blocks(info.block_bytes, keys.size(), chain_id);
    ASSERT_EQ(*client->Lookup(keys), 0u);
    ASSERT_TRUE(client->Put(chain_id, keys, data).ok());
    EXPECT_EQ(*client->Lookup(keys), 6u);
    // A longer chain: the stored prefix hits.
    auto longer = ChainKeys(chain_id, 9);
    EXPECT_EQ(*client->Lookup(longer), 6u);

    std::vector<std::byte> out(longer.size() * info.block_bytes);
    auto r = client->Restore(longer, out);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->hit_blocks, 6u);
    EXPECT_EQ(r->valid_blocks, 6u);
    EXPECT_EQ(0, std::memcmp(out.data(), data.data(), data.size()));

    uint32_t layers_seen = 0;
    auto rl = client->RestoreLayers(keys, [&](uint32_t layer, uint32_t blocks, std::span<const std::byte> bytes) {
      EXPECT_EQ(layer, layers_seen++);
      EXPECT_EQ(blocks, 6u);
      for (uint32_t b = 0; b < blocks; ++b) {
        EXPECT_EQ(0, std::memcmp(bytes.data() + b * info.block_layer_bytes,
                                 data.data() + b * info.block_bytes + layer * info.block_layer_bytes, info.block_layer_bytes));
      }
      return Status::Ok();
    });
    ASSERT_TRUE(rl.ok()) << rl.status().ToString();
    EXPECT_EQ(layers_seen, 5u);

    auto window = client->RegisterShmWindow(keys.size() * info.block_bytes + 4096);
    if (addr[0] == 't') {
      EXPECT_EQ(window.status().code(), Code::kNotSupported);
      continue;
    }
    ASSERT_TRUE(window.ok()) << window.status().ToString();
    uint32_t signalled = 0;
    auto rs = client->RestoreToShm(*window, 4096, keys, [&](uint32_t layer, uint32_t blocks, std::span<const std::byte>) {
      EXPECT_EQ(layer, signalled++);
      EXPECT_EQ(blocks, 6u);
      return Status::Ok();
    });
    ASSERT_TRUE(rs.ok()) << rs.status().ToString();
    EXPECT_EQ(rs->valid_blocks, 6u);
    EXPECT_EQ(signalled, 5u);
    auto expect = LayerMajor(data, 5, info.block_layer_bytes, keys.size());
    EXPECT_EQ(0, std::memcmp(window->base + 4096, expect.data(), expect.size()));
    // A chain that does not fit the window is refused, not written past it.
    auto too_long = ChainKeys(chain_id, 64);
    EXPECT_EQ(client->RestoreToShm(*window, 0, too_long).status().code(), Code::kInvalidArgument);
    EXPECT_TRUE(client->Health().ok());
  }
  EXPECT_TRUE(server->Stop().ok());
}

TEST(ServerTest, BadTokenAndAddressesAreRefused) {
  TempDir dir;
  auto server = StartServer(SmallServerConfig(dir.path()));
  ASSERT_NE(server, nullptr);
  ClientOptions o;
  o.token = "not-a-token-of-anyone";
  auto c = Client::Connect(server->unix_address(), o);
  EXPECT_EQ(c.status().code(), Code::kPermissionDenied);
  EXPECT_EQ(Client::Connect("bogus", o).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Client::Connect("unix:" + dir.Sub("nothing.sock"), o).status().code(), Code::kIoError);
  EXPECT_GE(server->metrics().auth_failures.load(), 1u);
}

// A connection's loop keeps it registered between requests. When a client
// leaves while a child process holds copies of the daemon's descriptors (as
// between fork and exec, which an embedding engine or a benchmark spawning
// redis does), closing the socket alone leaves the registration alive and the
// loop would be handed the freed connection again (this test's binary and
// `bench serve` crashed so). The loop takes it out of its set first.
TEST(ServerTest, ClientsThatLeaveWhileAChildHoldsTheSocketsAreNotServedAgain) {
  TempDir dir;
  auto server = StartServer(SmallServerConfig(dir.path()));
  ASSERT_NE(server, nullptr);
  auto keys = ChainKeys(5, 1);
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 16; ++i) {
    clients.push_back(ConnectOrNull(server->unix_address(), kTokenA));
    ASSERT_NE(clients.back(), nullptr);
    ASSERT_EQ(*clients.back()->Lookup(keys), 0u);
  }
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Keeps the daemon's ends (bound to the socket's path) and lets go of
    // the clients' (unnamed), so that the clients' leaving reaches the daemon.
    for (int fd = 3; fd < 1024; ++fd) {
      sockaddr_un a{};
      socklen_t len = sizeof a;
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0 && a.sun_family == AF_UNIX &&
          len <= offsetof(sockaddr_un, sun_path)) {
        ::close(fd);
      }
    }
    ::usleep(500 * 1000);
    ::_exit(0);
  }
  clients.clear();
  EXPECT_TRUE(WaitFor([&] { return server->metrics().connections_active.load() == 0; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the loop would be handed the stale registrations now
  auto again = ConnectOrNull(server->unix_address(), kTokenA);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(*again->Lookup(keys), 0u);
  int wstatus = 0;
  EXPECT_EQ(::waitpid(child, &wstatus, 0), child);
}

TEST(ServerTest, StartRefusesAFrameLimitBelowOneBlock) {
  TempDir dir;
  ServerConfig c = SmallServerConfig(dir.path());
  c.max_frame_bytes = 8192;  // a block is 80 KiB
  ASSERT_TRUE(FinalizeConfig(&c).ok());
  auto s = Server::Start(c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("max_frame_bytes 8192"), std::string::npos) << s.status().ToString();
}

TEST(ServerTest, TenantsCannotReachEachOthersBlocks) {
  TempDir dir;
  auto server = StartServer(SmallServerConfig(dir.path()));
  ASSERT_NE(server, nullptr);
  auto a = ConnectOrNull(server->unix_address(), kTokenA);
  auto b = ConnectOrNull(server->unix_address(), kTokenB);
  ASSERT_TRUE(a && b);
  auto keys = ChainKeys(7, 4);
  auto data = Blocks(a->info().block_bytes, keys.size(), 7);
  ASSERT_TRUE(a->Put(1, keys, data).ok());
  EXPECT_EQ(*a->Lookup(keys), 4u);
  // The same hashes from tenant b: a miss, and nothing comes back.
  EXPECT_EQ(*b->Lookup(keys), 0u);
  std::vector<std::byte> out(data.size());
  auto r = b->Restore(keys, out);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->hit_blocks, 0u);
  // b storing the same hashes does not touch a's blocks either.
  auto other = Blocks(b->info().block_bytes, keys.size(), 99);
  ASSERT_TRUE(b->Put(1, keys, other).ok());
  ASSERT_TRUE(a->Restore(keys, out).ok());
  EXPECT_EQ(0, std::memcmp(out.data(), data.data(), data.size()));
  ASSERT_TRUE(b->Restore(keys, out).ok());
  EXPECT_EQ(0, std::memcmp(out.data(), other.data(), other.size()));
}

TEST(ServerTest, QuotaDropsTheTenantsOldestSessionOrRefuses) {
  TempDir dir;
  ServerConfig c = SmallServerConfig(dir.path());
  const uint64_t bb = 5 * 16384;
  c.tenants[0].quota_bytes = 8 * bb;  // two sessions of 4 blocks
  auto server = StartServer(c);
  ASSERT_NE(server, nullptr);
  auto a = ConnectOrNull(server->unix_address(), kTokenA);
  ASSERT_NE(a, nullptr);
  std::vector<std::vector<BlockKey>> chains;
  for (uint64_t s = 0; s < 3; ++s) {
    chains.push_back(ChainKeys(100 + s, 4));
    ASSERT_TRUE(a->Put(s, chains.back(), Blocks(bb, 4, s)).ok());
  }
  EXPECT_EQ(*a->Lookup(chains[0]), 0u);  // dropped to make room
  EXPECT_EQ(*a->Lookup(chains[1]), 4u);
  EXPECT_EQ(*a->Lookup(chains[2]), 4u);
  auto big = ChainKeys(200, 9);
  EXPECT_EQ(a->Put(9, big, Blocks(bb, 9, 9)).code(), Code::kNoSpace);
  // Tenant b has no quota and is unaffected.
  auto b = ConnectOrNull(server->unix_address(), kTokenB);
  ASSERT_TRUE(b->Put(0, big, Blocks(bb, 9, 9)).ok());
  EXPECT_EQ(*b->Lookup(big), 9u);
}

constexpr const char* kStatsToken = "stats-token-0123456789";
const std::string kStatsAuth = std::string("Authorization: Bearer ") + kStatsToken + "\r\n";

TEST(ServerTest, HttpServesMetricsHealthAndStats) {
  TempDir dir;
  ServerConfig config = SmallServerConfig(dir.path());
  config.metrics_tenant_labels = true;
  config.stats_token = kStatsToken;
  auto server = StartServer(config);
  ASSERT_NE(server, nullptr);
  auto a = ConnectOrNull(server->tcp_address(), kTokenA);
  ASSERT_NE(a, nullptr);
  auto keys = ChainKeys(3, 2);
  ASSERT_TRUE(a->Put(0, keys, Blocks(a->info().block_bytes, 2, 3)).ok());
  std::vector<std::byte> out(2 * a->info().block_bytes);
  ASSERT_TRUE(a->Restore(keys, out).ok());
  const std::string metrics =
      HttpGetUntil(server->http_address(), "/metrics", "flatkv_restore_latency_seconds_bucket{tenant=\"a\",le=\"+Inf\"} 1");
  EXPECT_NE(metrics.find("HTTP/1.0 200"), std::string::npos);
  EXPECT_NE(metrics.find("flatkv_tenant_hit_blocks_total{tenant=\"a\",medium=\"dram\"} 2"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("flatkv_restore_latency_seconds_bucket{tenant=\"a\",le=\"+Inf\"} 1"), std::string::npos);
  EXPECT_NE(metrics.find("flatkv_capacity_bytes{medium=\"ssd\"}"), std::string::npos);
  EXPECT_NE(HttpGet(server->http_address(), "/healthz").find("200 OK"), std::string::npos);
  const std::string stats = HttpGet(server->http_address(), "/stats", kStatsAuth);
  EXPECT_NE(stats.find("\"restore_hit_dram\": 2"), std::string::npos) << stats;
  EXPECT_NE(HttpGet(server->http_address(), "/nope").find("404"), std::string::npos);
  auto json = a->StatsJson();
  ASSERT_TRUE(json.ok());
  EXPECT_NE(json->find("\"tenants\""), std::string::npos);
}

// The protocol's stats request answers with the caller's own tenant only:
// another tenant's name, quota and traffic stay behind /stats's token.
TEST(ServerTest, ProtocolStatsShowOnlyTheCallersTenant) {
  TempDir dir;
  ServerConfig config = SmallServerConfig(dir.path());
  config.tenants = {{"secret-team-alpha", kTokenA, "", 0}, {"secret-team-beta", kTokenB, "", 1 << 20}};
  auto server = StartServer(config);
  ASSERT_NE(server, nullptr);
  auto a = ConnectOrNull(server->tcp_address(), kTokenA);
  auto b = ConnectOrNull(server->tcp_address(), kTokenB);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto keys = ChainKeys(7, 1);
  ASSERT_TRUE(b->Put(0, keys, Blocks(b->info().block_bytes, 1, 7)).ok());
  auto as_a = a->StatsJson(), as_b = b->StatsJson();
  ASSERT_TRUE(as_a.ok() && as_b.ok());
  EXPECT_NE(as_a->find("secret-team-alpha"), std::string::npos) << *as_a;
  EXPECT_EQ(as_a->find("secret-team-beta"), std::string::npos) << *as_a;
  EXPECT_NE(as_b->find("secret-team-beta"), std::string::npos) << *as_b;
  EXPECT_EQ(as_b->find("secret-team-alpha"), std::string::npos) << *as_b;
}

// metrics.tenant_labels off (the default): per-tenant series are labelled by
// the tenant's position in [[tenants]], and no tenant name appears anywhere.
TEST(ServerTest, MetricsCarryNoTenantNamesUnlessConfigured) {
  TempDir dir;
  ServerConfig config = SmallServerConfig(dir.path());
  config.tenants = {{"secret-team-alpha", kTokenA, "", 0}, {"secret-team-beta", kTokenB, "", 1 << 20}};
  auto server = StartServer(config);
  ASSERT_NE(server, nullptr);
  auto b = ConnectOrNull(server->tcp_address(), kTokenB);
  ASSERT_NE(b, nullptr);
  auto keys = ChainKeys(5, 1);
  ASSERT_TRUE(b->Put(0, keys, Blocks(b->info().block_bytes, 1, 5)).ok());
  const std::string metrics =
      HttpGetUntil(server->http_address(), "/metrics", "flatkv_put_latency_seconds_count{tenant=\"1\"} 1");
  EXPECT_NE(metrics.find("flatkv_put_latency_seconds_count{tenant=\"1\"} 1"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("flatkv_tenant_requests_total{tenant=\"1\",kind=\"put\"} 1"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("flatkv_tenant_quota_bytes{tenant=\"1\"} 1048576"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("flatkv_tenant_requests_total{tenant=\"0\",kind=\"put\"} 0"), std::string::npos) << metrics;
  EXPECT_EQ(metrics.find("secret-team"), std::string::npos) << metrics;
  ASSERT_TRUE(server->Stop().ok());

  config.metrics_tenant_labels = true;
  server = StartServer(config);
  ASSERT_NE(server, nullptr);
  EXPECT_NE(server->PrometheusText().find("flatkv_tenant_quota_bytes{tenant=\"secret-team-beta\"} 1048576"),
            std::string::npos);
}

// /stats shows every tenant, so it wants the dedicated metrics.stats_token
// (not a tenant's token) as a bearer token, and says so with a 401.
TEST(ServerTest, StatsRequireTheStatsToken) {
  TempDir dir;
  ServerConfig config = SmallServerConfig(dir.path());
  {
    auto server = StartServer(config);  // no stats_token: /stats is off
    ASSERT_NE(server, nullptr);
    const std::string r = HttpGet(server->http_address(), "/stats", kStatsAuth);
    EXPECT_NE(r.find("HTTP/1.0 401 Unauthorized\r\n"), std::string::npos) << r;
    EXPECT_NE(r.find("WWW-Authenticate: Bearer"), std::string::npos) << r;
    EXPECT_NE(r.find("/stats is disabled: set metrics.stats_token"), std::string::npos) << r;
    EXPECT_NE(HttpGet(server->http_address(), "/metrics").find("HTTP/1.0 200"), std::string::npos);
  }
  config.stats_token = kStatsToken;
  auto server = StartServer(config);
  ASSERT_NE(server, nullptr);
  const std::string& http = server->http_address();
  for (const std::string& bad : {std::string(), std::string("Authorization: Bearer wrong-token-0123456789\r\n"),
                                 std::string("Authorization: Bearer ") + kTokenA + "\r\n",  // a tenant's token
                                 std::string("Authorization: Basic ") + kStatsToken + "\r\n",
                                 std::string("X-Authorization: Bearer ") + kStatsToken + "\r\n"}) {
    const std::string r = HttpGet(http, "/stats", bad);
    EXPECT_NE(r.find("HTTP/1.0 401 Unauthorized\r\n"), std::string::npos) << bad << r;
    EXPECT_NE(r.find("/stats needs 'Authorization: Bearer TOKEN'"), std::string::npos) << r;
    EXPECT_EQ(r.find("\"tenants\""), std::string::npos) << r;
  }
  EXPECT_NE(HttpGet(http, "/stats", kStatsAuth).find("HTTP/1.0 200 OK"), std::string::npos);
  const std::string lower =
      HttpGet(http, "/stats", std::string("User-Agent: t\r\nauthorization: bearer ") + kStatsToken + "\r\n");
  EXPECT_NE(lower.find("\"tenants\""), std::string::npos) << lower;
}

// /stats carries the options the daemon's store was configured with, and
// the number of SSD directories rather than their paths.
TEST(ServerTest, StatsReportTheStoresOptionsWithoutPaths) {
  TempDir dir;
  ServerConfig config = SmallServerConfig(dir.path());
  ASSERT_TRUE(ApplyConfigToml("[store]\nsession_dram_share_bytes = \"3MiB\"\ndram_idle_after_ms = 777\n"
                              "ssd_admission = \"on-reuse\"\n[metrics]\nstats_token = \"stats-token-0123456789\"\n",
                              "test.toml", &config)
                  .ok());
  auto server = StartServer(config);
  ASSERT_NE(server, nullptr);
  const std::string stats = HttpGet(server->http_address(), "/stats", kStatsAuth);
  EXPECT_NE(stats.find("\"session_dram_share_bytes\": 3145728"), std::string::npos) << stats;
  EXPECT_NE(stats.find("\"dram_idle_after_ms\": 777"), std::string::npos) << stats;
  EXPECT_NE(stats.find("\"ssd_admission\": \"on-reuse\""), std::string::npos) << stats;
  EXPECT_NE(stats.find("\"ssd_dirs\": 1"), std::string::npos) << stats;
  EXPECT_EQ(stats.find(dir.path()), std::string::npos) << stats;
}

TEST(ServerTest, StopPersistsAndRestartsWarm) {
  TempDir dir;
  auto keys = ChainKeys(11, 8);
  std::vector<std::byte> data;
  {
    auto server = StartServer(SmallServerConfig(dir.path()));
    ASSERT_NE(server, nullptr);
    auto a = ConnectOrNull(server->unix_address(), kTokenA);
    data = Blocks(a->info().block_bytes, keys.size(), 11);
    ASSERT_TRUE(a->Put(0, keys, data, PutHint::kOneShot).ok());  // to SSD
    ASSERT_TRUE(server->Stop().ok());
    EXPECT_FALSE(a->Health().ok());  // the idle connection was closed
  }
  auto server = StartServer(SmallServerConfig(dir.path()));
  ASSERT_NE(server, nullptr);
  auto a = ConnectOrNull(server->unix_address(), kTokenA);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(*a->Lookup(keys), 8u);
  std::vector<std::byte> out(data.size());
  auto r = a->Restore(keys, out);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->valid_blocks, 8u);
  EXPECT_EQ(0, std::memcmp(out.data(), data.data(), data.size()));
}

}  // namespace
}  // namespace flatkv::service

namespace flatkv::service {
namespace {

// drop_session (protocol 2): the session's blocks go, a block another live
// session of the tenant references stays, its quota use is released, and
// the same session id of another tenant is untouched.
TEST(ServerTest, DropSessionOverTheWire) {
  TempDir dir;
  ServerConfig config = SmallServerConfig(dir.path());
  config.tenants = {{"a", kTokenA, "", 1 << 30}, {"b", kTokenB, "", 0}};
  auto server = StartServer(config);
  ASSERT_NE(server, nullptr);
  auto a = ConnectOrNull(server->tcp_address(), kTokenA);
  auto b = ConnectOrNull(server->tcp_address(), kTokenB);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->info().protocol_version, 6u);
  const uint64_t bb = a->info().block_bytes;
  auto shared = ChainKeys(11, 2), own = ChainKeys(12, 2);
  ASSERT_TRUE(a->Put(1, shared, Blocks(bb, 2, 11)).ok());
  ASSERT_TRUE(a->Put(2, shared, Blocks(bb, 2, 11)).ok());  // session 2 references session 1's blocks
  ASSERT_TRUE(a->Put(3, own, Blocks(bb, 2, 12)).ok());
  ASSERT_TRUE(b->Put(3, own, Blocks(bb, 2, 12)).ok());
  const uint64_t used = server->tenants().UsedBytes(server->tenants().tenants()[0]);
  EXPECT_GT(used, 0u);
  ASSERT_TRUE(a->DropSession(1).ok());
  EXPECT_EQ(*a->Lookup(shared), 2u) << "a block session 2 references must stay";
  ASSERT_TRUE(a->DropSession(3).ok());
  EXPECT_EQ(*a->Lookup(own), 0u);
  EXPECT_EQ(*b->Lookup(own), 2u) << "tenant b's session 3 is another session";
  EXPECT_LT(server->tenants().UsedBytes(server->tenants().tenants()[0]), used);
  const Status again = a->DropSession(1);
  EXPECT_EQ(again.code(), Code::kNotFound) << again.ToString();
  EXPECT_NE(again.message().find("session 1 has no blocks"), std::string::npos) << again.ToString();
}

// prune (protocol 6): the daemon builds the tenant's view; its keys are
// what the client derives from its own chain, its blocks are charged to the
// tenant, another tenant reaches neither the chain nor the view.
TEST(ServerTest, PruneOverTheWire) {
  TempDir dir;
  ServerConfig config = SmallServerConfig(dir.path());
  config.tenants = {{"a", kTokenA, "", 1 << 30}, {"b", kTokenB, "", 0}};
  auto server = StartServer(config);
  ASSERT_NE(server, nullptr);
  auto a = ConnectOrNull(server->tcp_address(), kTokenA);
  auto b = ConnectOrNull(server->tcp_address(), kTokenB);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const uint64_t bb = a->info().block_bytes;
  const uint32_t bt = a->info().block_tokens;
  auto chain = ChainKeys(21, 4);
  const std::vector<std::byte> data = Blocks(bb, 4, 21);
  ASSERT_TRUE(a->Put(1, chain, data).ok());
  const uint64_t used = server->tenants().UsedBytes(server->tenants().tenants()[0]);
  const std::vector<TokenRange> ranges = {{1, bt + 5}, {2 * bt, 3 * bt}};
  auto r = a->Prune(chain, ranges);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->kept_tokens, 4 * bt - (bt + 4) - bt);
  EXPECT_EQ(r->view_blocks, 2u);
  EXPECT_EQ(r->stored_blocks, 2u);
  const auto view = PruneViewKeys(chain.back(), 4, ranges, bt);
  EXPECT_EQ(r->view_session, PruneViewSession(view[0]));
  EXPECT_EQ(*a->Lookup(view), 2u);
  EXPECT_EQ(*b->Lookup(view), 0u);
  EXPECT_EQ(server->tenants().UsedBytes(server->tenants().tenants()[0]), used + 2 * bb);
  // The view's bytes: the kept rows in order (row = a token's K or V of one layer).
  std::vector<std::byte> out(2 * bb);
  auto got = a->Restore(view, out);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->valid_blocks, 2u);
  const uint64_t lb = a->info().block_layer_bytes, row = lb / (2 * bt);
  const auto kept = PruneKeptPositions(ranges, 4 * bt);
  for (uint32_t l = 0; l < a->info().shape.layers; ++l)
    for (size_t j = 0; j < kept.size(); ++j) {
      const std::byte* src = data.data() + (kept[j] / bt) * bb + l * lb;
      const std::byte* dst = out.data() + (j / bt) * bb + l * lb;
      ASSERT_EQ(0, std::memcmp(dst + (j % bt) * row, src + (kept[j] % bt) * row, row)) << "layer " << l << " token " << j;
      ASSERT_EQ(0, std::memcmp(dst + (bt + j % bt) * row, src + (bt + kept[j] % bt) * row, row));
    }
  auto other = b->Prune(chain, ranges);
  EXPECT_EQ(other.status().code(), Code::kNotFound) << other.status().ToString();
  auto bad = a->Prune(chain, std::vector<TokenRange>{{5, 5}});
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  ASSERT_TRUE(a->DropSession(r->view_session).ok());
  EXPECT_EQ(*a->Lookup(view), 0u);
  EXPECT_EQ(*a->Lookup(chain), 4u);
}

// Prefetch over the wire: the tenant's SSD-only blocks come into DRAM in
// the background, the reply says how many were found, another tenant's
// keys find nothing, and a protocol-2 connection is told what it needs.
// What a connection that negotiated protocol `version` is answered to
// `request`: its error, or OK for any other reply.
Status ReplyAtProtocol(const std::string& address, uint32_t version, const std::vector<std::byte>& request) {
  const int fd = RawConnect(address);
  if (fd < 0) return Status::IoError("cannot connect to " + address);
  wire::Hello hello;
  hello.token = kTokenA;
  hello.max_version = version;
  wire::Header h;
  std::vector<std::byte> p;
  Status st = Status::IoError("no hello_ok");
  if (SendAll(fd, wire::EncodeHello(1, hello)) && ReadRaw(fd, &h, &p) && h.type == wire::Type::kHelloOk &&
      SendAll(fd, request) && ReadRaw(fd, &h, &p))
    st = h.type == wire::Type::kError ? wire::ErrorStatus(p) : Status::Ok();
  ::close(fd);
  return st;
}

TEST(ServerTest, PrefetchOverTheWire) {
  TempDir dir;
  auto server = StartServer(SmallServerConfig(dir.path()));
  ASSERT_NE(server, nullptr);
  auto a = ConnectOrNull(server->tcp_address(), kTokenA);
  auto b = ConnectOrNull(server->tcp_address(), kTokenB);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const uint64_t bb = a->info().block_bytes;
  const auto keys = ChainKeys(21, 4);
  ASSERT_TRUE(a->Put(1, keys, Blocks(bb, 4, 21), PutHint::kOneShot).ok());
  const uint64_t readmitted = server->store().Stats().readmitted_blocks;
  auto found = a->Prefetch(ChainKeys(21, 6));
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(*found, 4u);
  EXPECT_TRUE(WaitFor([&] { return server->store().Stats().readmitted_blocks == readmitted + 4; }));
  EXPECT_EQ(*b->Prefetch(keys), 0u) << "tenant b's keys are salted apart";
  // A connection that negotiated protocol 2.
  wire::Lookup m;
  m.keys = keys;
  const Status st = ReplyAtProtocol(server->tcp_address(), 2, wire::EncodePrefetch(2, m));
  EXPECT_EQ(st.code(), Code::kNotSupported);
  EXPECT_NE(st.message().find("prefetch needs protocol version 3; this connection negotiated 2"), std::string::npos)
      << st.ToString();
}

TEST(ServerTest, RetainAndTruncateSessionOverTheWire) {
  TempDir dir;
  ServerConfig c = SmallServerConfig(dir.path());
  c.max_retain = std::chrono::milliseconds(60000);
  auto server = StartServer(c);
  ASSERT_NE(server, nullptr);
  auto a = ConnectOrNull(server->tcp_address(), kTokenA);
  auto b = ConnectOrNull(server->tcp_address(), kTokenB);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const uint64_t bb = a->info().block_bytes;
  ASSERT_TRUE(a->Put(1, ChainKeys(31, 8), Blocks(bb, 8, 31)).ok());
  // The daemon tells the store whose session it is (DRAM fairness).
  EXPECT_GT(server->store().Stats().tenant_dram_bytes.at(1), 0u);
  EXPECT_EQ(server->store().Stats().tenant_dram_bytes.count(2), 0u);
  // Retain: the stored prefix, in tenant a's namespace only.
  auto kept = a->Retain(ChainKeys(31, 10), std::chrono::milliseconds(30000));
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ(*kept, 8u);
  EXPECT_EQ(server->store().Stats().retained_extents, 2u);
  EXPECT_EQ(*b->Retain(ChainKeys(31, 8), std::chrono::milliseconds(30000)), 0u) << "tenant b's keys are salted apart";
  EXPECT_EQ(*a->Retain(ChainKeys(31, 8), std::chrono::milliseconds(0)), 0u);  // released
  // Truncate: session 1 keeps 3 blocks; the quota use shrinks with it.
  auto released = a->TruncateSession(1, 3);
  ASSERT_TRUE(released.ok()) << released.status().ToString();
  EXPECT_EQ(*released, 5u);
  EXPECT_EQ(*a->Lookup(ChainKeys(31, 8)), 3u);
  EXPECT_EQ(server->tenants().UsedBytes(server->tenants().tenants()[0]), 3 * bb);
  EXPECT_EQ(b->TruncateSession(1, 0).status().code(), Code::kNotFound) << "b has no session 1";
  EXPECT_EQ(*a->Lookup(ChainKeys(31, 3)), 3u);
  // A protocol-3 connection is told what it needs.
  const Status st = ReplyAtProtocol(server->tcp_address(), 3, wire::EncodeTruncateSession(2, {1, 0}));
  EXPECT_EQ(st.code(), Code::kNotSupported);
  EXPECT_NE(st.message().find("truncate_session needs protocol version 4; this connection negotiated 3"), std::string::npos)
      << st.ToString();
}

TEST(ServerTest, APutsChainPositionCrossesTheWireSoTruncationCutsWhereTheEngineSaid) {
  TempDir dir;
  auto server = StartServer(SmallServerConfig(dir.path()));
  ASSERT_NE(server, nullptr);
  auto a = ConnectOrNull(server->tcp_address(), kTokenA);
  ASSERT_NE(a, nullptr);
  ASSERT_GE(a->info().protocol_version, 5u);  // first_block is protocol 5
  const uint64_t bb = a->info().block_bytes;
  // Session 1: blocks 0..3 of one history, then a rewritten tail put at
  // positions 2..5 (first_block 2). Without the position it would have gone
  // on at 4..7.
  ASSERT_TRUE(a->Put(1, ChainKeys(41, 4), Blocks(bb, 4, 41), PutHint::kAuto, 0).ok());
  ASSERT_TRUE(a->Put(1, ChainKeys(42, 4), Blocks(bb, 4, 42), PutHint::kAuto, 2).ok());
  // Keeping 4 positions releases the rewritten tail's blocks at positions 4
  // and 5; had the put gone on at 4..7, all four would go.
  auto released = a->TruncateSession(1, 4);
  ASSERT_TRUE(released.ok()) << released.status().ToString();
  EXPECT_EQ(*released, 2u);
  EXPECT_EQ(*a->Lookup(ChainKeys(42, 4)), 2u);
  EXPECT_EQ(*a->Lookup(ChainKeys(41, 4)), 4u);
  // A protocol-4 connection that sends a position is told what it needs.
  wire::Put m;
  m.session = 1;
  m.has_first_block = true;
  m.first_block = 0;
  const Status st = ReplyAtProtocol(server->tcp_address(), 4, wire::EncodePutHead(2, m, 0));
  EXPECT_EQ(st.code(), Code::kNotSupported);
  EXPECT_NE(st.message().find("put with a first_block needs protocol version 5; this connection negotiated 4"),
            std::string::npos)
      << st.ToString();
}

TEST(ServerTest, RetainsAreBoundedByTheTenantsPinBudgetAndTheTtlCap) {
  TempDir dir;
  ServerConfig c = SmallServerConfig(dir.path());
  const uint64_t bb = 5ull * 16384;  // SmallOptions' block
  c.tenant_pinned_bytes = 6 * bb;
  c.max_retain = std::chrono::milliseconds(200);
  auto server = StartServer(c);
  ASSERT_NE(server, nullptr);
  auto a = ConnectOrNull(server->tcp_address(), kTokenA);
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->info().block_bytes, bb);
  ASSERT_TRUE(a->Put(1, ChainKeys(41, 4), Blocks(bb, 4, 41)).ok());
  ASSERT_TRUE(a->Put(2, ChainKeys(42, 4), Blocks(bb, 4, 42)).ok());
  EXPECT_EQ(*a->Retain(ChainKeys(41, 4), std::chrono::milliseconds(3600000)), 4u);
  // Only 2 blocks of budget are left for the second chain.
  EXPECT_EQ(*a->Retain(ChainKeys(42, 4), std::chrono::milliseconds(3600000)), 2u);
  EXPECT_EQ(server->tenants().RetainedBytes(server->tenants().tenants()[0]), 6 * bb);
  // The hour asked for was cut to max_retain (200 ms): the budget comes back.
  EXPECT_TRUE(WaitFor([&] { return server->tenants().RetainedBytes(server->tenants().tenants()[0]) == 0; }));
  EXPECT_TRUE(WaitFor([&] { return server->store().Stats().retained_extents == 0; }));
  EXPECT_EQ(*a->Retain(ChainKeys(42, 4), std::chrono::milliseconds(3600000)), 4u);
}

}  // namespace
}  // namespace flatkv::service
