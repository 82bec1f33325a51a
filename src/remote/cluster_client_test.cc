// The Redis Cluster client against a real local cluster (3 masters, 3
// replicas on loopback), started by ctest's RedisCluster fixture
// (scripts/redis-cluster.sh; CMakeLists.txt) and stopped by it, on failure
// too. Also: the slot hash, and malformed replies from a fake server.
#include "remote/cluster_client.h"
#include "remote/cluster_test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

namespace flatkv::remote {
namespace {

using namespace std::chrono_literals;

TEST(KeySlotTest, MatchesRedisClusterSpec) {
  EXPECT_EQ(Crc16("123456789"), 0x31C3);  // the spec's check value
  EXPECT_EQ(KeySlot("foo"), 12182);       // CLUSTER KEYSLOT foo
  EXPECT_EQ(KeySlot("somekey"), 11058);
  EXPECT_EQ(KeySlot("{user1000}.following"), KeySlot("{user1000}.followers"));
  EXPECT_EQ(KeySlot("{user1000}.following"), KeySlot("user1000"));
  EXPECT_EQ(KeySlot("foo{}{bar}"), Crc16("foo{}{bar}") % kClusterSlots);  // an empty tag: the whole key
  EXPECT_EQ(KeySlot("foo{{bar}}zap"), KeySlot("{bar"));
  EXPECT_EQ(KeySlot("foo{bar}{zap}"), KeySlot("bar"));
}

// A loopback server that answers every connection's first request with `reply`.
class FakeServer {
 public:
  explicit FakeServer(std::string reply) : reply_(std::move(reply)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    ::listen(fd_, 4);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      for (;;) {
        const int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        char buf[512];
        if (::recv(c, buf, sizeof(buf), 0) > 0) (void)!::send(c, reply_.data(), reply_.size(), MSG_NOSIGNAL);
        ::usleep(50000);
        ::close(c);
      }
    });
  }
  ~FakeServer() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  std::string reply_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
};

TEST(ClusterClientFakeTest, MalformedRepliesAreCorruptionNotCrashes) {
  for (const std::string& reply : {std::string("?garbage\r\n"), std::string("$5\r\nab\r\n\r\n*1\r\n"),
                                  std::string("*1\r\n*3\r\n:0\r\n:99999\r\n*2\r\n$9\r\n127.0.0.1\r\n:1\r\n"),
                                  std::string("*1\r\n:5\r\n"), std::string("+OK\r\n")}) {
    FakeServer fake(reply);
    ClusterOptions o;
    o.seeds = {fake.address()};
    o.timeout = 300ms;
    auto c = ClusterClient::Connect(o);
    ASSERT_FALSE(c.ok()) << reply;
    EXPECT_NE(c.status().message().find(fake.address()), std::string::npos) << c.status().ToString();
  }
}

TEST(RespConnectionTest, ABulkReplyGoesToTheSinkWithoutACopy) {
  FakeServer fake("$11\r\nhello world\r\n");
  auto c = RespConnection::Connect("127.0.0.1", uint16_t(std::stoi(fake.address().substr(10))), {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const auto deadline = Clock::now() + 1s;
  ASSERT_TRUE((*c)->Send(EncodeCommand({"GET", "k"}), deadline).ok());
  std::string seen;
  const BulkSink sink = [&](std::string_view b) { seen.assign(b); };
  auto r = (*c)->Read(deadline, &sink);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->sunk);
  EXPECT_TRUE(r->str.empty());
  EXPECT_EQ(seen, "hello world");
}

TEST(ClusterClientFakeTest, BadSeedsAreRefusedByName) {
  ClusterOptions o;
  EXPECT_EQ(ClusterClient::Connect(o).status().code(), Code::kInvalidArgument);
  o.seeds = {"localhost"};
  auto c = ClusterClient::Connect(o);
  EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
  EXPECT_NE(c.status().message().find("localhost"), std::string::npos);
}

using cluster_testing::ClusterDir;
std::vector<std::string> Seeds() { return cluster_testing::LocalClusterSeeds(); }

class ClusterClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seeds_ = Seeds();
    ASSERT_FALSE(seeds_.empty()) << "no cluster at " << ClusterDir()
                                 << " (ctest's RedisCluster fixture starts one: scripts/redis-cluster.sh)";
    ClusterOptions o;
    o.seeds = seeds_;
    auto c = ClusterClient::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(c).value();
  }
  std::string Key(const std::string& test, int i) { return "fkv:test:" + test + ":" + std::to_string(i); }

  std::vector<std::string> seeds_;
  std::unique_ptr<ClusterClient> client_;
};

TEST_F(ClusterClientTest, PipelinedSetAndGetSpreadOverEveryShard) {
  const auto masters = client_->Masters();
  ASSERT_EQ(masters.size(), 3u);
  std::vector<std::string> keys, values;
  for (int i = 0; i < 300; ++i) {
    keys.push_back(Key("spread", i));
    values.push_back(std::string(size_t(100 + i), char('a' + i % 26)));
  }
  std::vector<std::vector<std::string_view>> sets, gets;
  for (size_t i = 0; i < keys.size(); ++i) {
    sets.push_back({"SET", keys[i], values[i]});
    gets.push_back({"GET", keys[i]});
  }
  for (auto& r : client_->Pipeline(sets)) ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto got = client_->Pipeline(gets);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << got[i].status().ToString();
    EXPECT_EQ(got[i]->str, values[i]);
  }
  std::set<std::string> used;
  for (const auto& k : keys) used.insert(client_->NodeForSlot(KeySlot(k)));
  EXPECT_EQ(used.size(), 3u) << "300 keys without a hash tag should land on every master";
  auto missing = client_->Command({"GET", "fkv:test:never-set"});
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(missing->type, RespValue::kNil);
}

TEST_F(ClusterClientTest, FollowsMovedAndRefreshesTheSlotMap) {
  const auto masters = client_->Masters();
  std::vector<std::string> keys;
  for (int i = 0; i < 40; ++i) {
    keys.push_back(Key("moved", i));
    ASSERT_TRUE(client_->Command({"SET", keys.back(), keys.back()}).ok());
  }
  client_->PointAllSlotsAtForTest(masters[0]);
  for (const auto& k : keys) {
    auto r = client_->Command({"GET", k});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->str, k);
  }
  EXPECT_GT(client_->stats().moved, 0u);
  EXPECT_GT(client_->stats().refreshes, 1u);
  // A pipeline against a stale map is redone through the redirects.
  client_->PointAllSlotsAtForTest(masters[1]);
  std::vector<std::vector<std::string_view>> gets;
  for (const auto& k : keys) gets.push_back({"GET", k});
  auto got = client_->Pipeline(gets);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << got[i].status().ToString();
    EXPECT_EQ(got[i]->str, keys[i]);
  }
}

TEST_F(ClusterClientTest, FollowsAskDuringASlotMigration) {
  // A key whose slot holds no other key (the other tests' objects spread
  // over every slot, and a slot still holding keys cannot be reassigned).
  std::string key, from;
  uint16_t slot = 0;
  for (int i = 1; i <= 10000 && from.empty(); ++i) {
    key = Key("ask", i);
    slot = KeySlot(key);
    const std::string at = client_->NodeForSlot(slot);
    const std::string s = std::to_string(slot);
    const std::string_view count[] = {"CLUSTER", "COUNTKEYSINSLOT", s};
    auto n = client_->CommandAt(at, count);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    if (n->integer == 0) from = at;
  }
  ASSERT_FALSE(from.empty()) << "no empty slot among 10000 keys";
  std::string to;
  for (const auto& m : client_->Masters())
    if (m != from) to = m;
  const std::string_view myid[] = {"CLUSTER", "MYID"};
  auto from_id = client_->CommandAt(from, myid), to_id = client_->CommandAt(to, myid);
  ASSERT_TRUE(from_id.ok() && to_id.ok());
  const std::string s = std::to_string(slot);
  const std::string_view importing[] = {"CLUSTER", "SETSLOT", s, "IMPORTING", from_id->str};
  const std::string_view migrating[] = {"CLUSTER", "SETSLOT", s, "MIGRATING", to_id->str};
  ASSERT_TRUE(client_->CommandAt(to, importing).ok());
  ASSERT_TRUE(client_->CommandAt(from, migrating).ok());
  // The key is not on `from`, so `from` answers ASK and the client asks `to`.
  auto set = client_->Command({"SET", key, "moved-by-ask"});
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  auto get = client_->Command({"GET", key});
  ASSERT_TRUE(get.ok()) << get.status().ToString();
  EXPECT_EQ(get->str, "moved-by-ask");
  EXPECT_GE(client_->stats().ask, 2u);
  // Finish the migration: the slot is `to`'s now, everywhere.
  const std::string_view node[] = {"CLUSTER", "SETSLOT", s, "NODE", to_id->str};
  for (const auto& m : client_->Masters()) {
    auto done = client_->CommandAt(m, node);
    ASSERT_TRUE(done.ok()) << m << ": " << done.status().ToString();
  }
  ASSERT_TRUE(client_->RefreshSlots().ok());
  EXPECT_EQ(client_->NodeForSlot(slot), to);
  EXPECT_EQ(client_->Command({"GET", key})->str, "moved-by-ask");
}

TEST_F(ClusterClientTest, AclUserRestrictedByKeyPattern) {
  const auto masters = client_->Masters();
  const std::string_view setuser[] = {"ACL", "SETUSER", "fkv-acl-test", "on", ">s3cret", "~fkv:acl:*", "+@all"};
  const std::string_view deluser[] = {"ACL", "DELUSER", "fkv-acl-test"};
  for (const auto& m : masters) ASSERT_TRUE(client_->CommandAt(m, setuser).ok()) << m;
  ClusterOptions o;
  o.seeds = seeds_;
  o.user = "fkv-acl-test";
  o.password = "s3cret";
  auto c = ClusterClient::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE((*c)->Command({"SET", "fkv:acl:1", "x"}).ok());
  auto denied = (*c)->Command({"SET", "other:1", "x"});
  EXPECT_EQ(denied.status().code(), Code::kPermissionDenied) << denied.status().ToString();
  o.password = "wrong";
  auto bad = ClusterClient::Connect(o);
  EXPECT_EQ(bad.status().code(), Code::kPermissionDenied) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("fkv-acl-test"), std::string::npos) << bad.status().ToString();
  for (const auto& m : masters) EXPECT_TRUE(client_->CommandAt(m, deluser).ok()) << m;
}

TEST_F(ClusterClientTest, AStalledShardTimesOutInsteadOfHanging) {
  const std::string key = Key("stall", 1);
  ASSERT_TRUE(client_->Command({"SET", key, "v"}).ok());
  const std::string node = client_->NodeForSlot(KeySlot(key));
  ClusterOptions o;
  o.seeds = seeds_;
  o.timeout = 200ms;
  o.retry_for = 300ms;
  auto c = ClusterClient::Connect(o);
  ASSERT_TRUE(c.ok());
  const std::string_view pause[] = {"CLIENT", "PAUSE", "1500", "ALL"};
  ASSERT_TRUE(client_->CommandAt(node, pause).ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto r = (*c)->Command({"GET", key});
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_FALSE(r.ok());
  EXPECT_LT(took, 1400ms) << "the request waited for the pause instead of timing out";
  std::this_thread::sleep_for(1600ms);
  auto after = (*c)->Command({"GET", key});
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_EQ(after->str, "v");
}

pid_t NodePid(const std::string& node) {
  const std::string port = node.substr(node.rfind(':') + 1);
  std::ifstream in(ClusterDir() + "/" + port + "/redis.pid");
  pid_t pid = 0;
  in >> pid;
  return pid;
}

TEST_F(ClusterClientTest, KillingAMasterLosesNoAcknowledgedWriteAndNeverReturnsWrongBytes) {
  std::vector<std::string> keys;
  for (int i = 0; i < 60; ++i) {
    keys.push_back(Key("failover", i));
    ASSERT_TRUE(client_->Command({"SET", keys.back(), "value-" + keys.back()}).ok());
  }
  const std::string victim = client_->NodeForSlot(KeySlot(keys[0]));
  // Every write is on its replica before the kill (WAIT on each master).
  const std::string_view wait[] = {"WAIT", "1", "2000"};
  for (const auto& m : client_->Masters()) {
    auto w = client_->CommandAt(m, wait);
    ASSERT_TRUE(w.ok() && w->integer >= 1) << m << ": " << (w.ok() ? std::to_string(w->integer) : w.status().ToString());
  }
  const pid_t pid = NodePid(victim);
  ASSERT_GT(pid, 0);
  ClusterOptions o;
  o.seeds = seeds_;
  o.timeout = 300ms;
  o.retry_for = 15s;
  auto reader = ClusterClient::Connect(o);
  ASSERT_TRUE(reader.ok());
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  uint64_t ok = 0, wrong = 0, failed = 0;
  const auto end = std::chrono::steady_clock::now() + 12s;
  bool recovered = false;
  while (std::chrono::steady_clock::now() < end && !recovered) {
    bool all = true;
    for (const auto& k : keys) {
      auto r = (*reader)->Command({"GET", k});
      if (!r.ok()) {
        ++failed;
        all = false;
      } else if (r->str != "value-" + k) {
        ++wrong;
      } else {
        ++ok;
      }
    }
    recovered = all;
  }
  EXPECT_EQ(wrong, 0u);
  EXPECT_TRUE(recovered) << "a replica was not promoted within 12 s (" << failed << " failed reads)";
  EXPECT_GT(ok, 0u);
  EXPECT_NE((*reader)->NodeForSlot(KeySlot(keys[0])), victim);
  // Bring the node back (it rejoins as a replica) for the tests after this one.
  const std::string port = victim.substr(victim.rfind(':') + 1);
  const std::string cmd = std::string("bash ") + FLATKV_SOURCE_DIR + "/scripts/redis-cluster.sh restart " + ClusterDir() +
                          " " + port + " >/dev/null";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
}

// The TLS-only cluster beside the plain one (REDIS_CLUSTER_TLS=1
// scripts/redis-cluster.sh: client connections and the cluster bus both
// TLS, verified against the fixture's own CA).
ClusterOptions TlsOptions() {
  ClusterOptions o;
  o.seeds = cluster_testing::LocalClusterSeeds(cluster_testing::TlsClusterDir());
  o.tls = true;
  o.tls_ca_file = cluster_testing::TlsClusterCa();
  return o;
}

TEST(ClusterClientTlsTest, PipelinesOverTlsReachEveryShard) {
  const ClusterOptions o = TlsOptions();
  ASSERT_FALSE(o.seeds.empty()) << "no TLS cluster at " << cluster_testing::TlsClusterDir()
                                << " (ctest's RedisCluster fixture starts one: scripts/redis-cluster.sh)";
  auto c = ClusterClient::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ClusterClient& client = **c;
  ASSERT_EQ(client.Masters().size(), 3u);
  std::vector<std::string> keys, values;
  for (int i = 0; i < 200; ++i) {
    keys.push_back("fkv:test:tls:" + std::to_string(i));
    values.push_back(std::string(size_t(1000 + 37 * i), char('A' + i % 26)));  // up to 8 KB: several TLS records
  }
  std::vector<std::vector<std::string_view>> sets, gets;
  for (size_t i = 0; i < keys.size(); ++i) {
    sets.push_back({"SET", keys[i], values[i]});
    gets.push_back({"GET", keys[i]});
  }
  for (auto& r : client.Pipeline(sets)) ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto got = client.Pipeline(gets);
  std::set<std::string> used;
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << got[i].status().ToString();
    EXPECT_EQ(got[i]->str, values[i]) << keys[i];
    used.insert(client.NodeForSlot(KeySlot(keys[i])));
  }
  EXPECT_EQ(used.size(), 3u);
}

TEST(ClusterClientTlsTest, AnUntrustedServerOrAPlainClientIsRefusedWithinTheTimeout) {
  ClusterOptions o = TlsOptions();
  ASSERT_FALSE(o.seeds.empty()) << "no TLS cluster at " << cluster_testing::TlsClusterDir();
  o.timeout = std::chrono::milliseconds(1000);
  o.retry_for = std::chrono::milliseconds(0);
  // The system's CAs do not know the fixture's CA: verification fails.
  ClusterOptions untrusted = o;
  untrusted.tls_ca_file.clear();
  auto start = std::chrono::steady_clock::now();
  auto c = ClusterClient::Connect(untrusted);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("TLS"), std::string::npos) << c.status().ToString();
  EXPECT_NE(c.status().message().find("certificate"), std::string::npos) << c.status().ToString();
  // A CA file that does not exist is named.
  ClusterOptions missing = o;
  missing.tls_ca_file = cluster_testing::TlsClusterDir() + "/tls/no-such-ca.crt";
  auto m = ClusterClient::Connect(missing);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("no-such-ca.crt"), std::string::npos) << m.status().ToString();
  // Plain RESP to a TLS port: an error, not a hang.
  ClusterOptions plain = o;
  plain.tls = false;
  auto p = ClusterClient::Connect(plain);
  ASSERT_FALSE(p.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  // Without verification the same untrusted server is accepted.
  untrusted.tls_verify = false;
  auto v = ClusterClient::Connect(untrusted);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  auto r = (*v)->Command({"SET", "fkv:test:tls:unverified", "x"});
  EXPECT_TRUE(r.ok()) << r.status().ToString();
}

}  // namespace
}  // namespace flatkv::remote
