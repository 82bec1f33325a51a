// Tenant salting and authentication, the cross-tenant timing attack, and
// TLS on the TCP listener.
#include "service/tenants.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>

#include "service/test_server.h"

namespace flatkv::service {
namespace {

using flatkv::testing::ChainKeys;
using flatkv::testing::TempDir;
using namespace flatkv::service::testing;

TEST(TenantsTest, SaltingIsPerTenantDeterministicAndInjective) {
  auto reg = TenantRegistry::Make({{"a", kTokenA, "", 0}, {"b", kTokenB, "", 0}, {"c", "tenant-c-token-xxxxxxx", kTokenA, 0}});
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  const auto& t = (*reg)->tenants();
  auto sa = KeySalter::Make(t[0]), sa2 = KeySalter::Make(t[0]), sb = KeySalter::Make(t[1]), sc = KeySalter::Make(t[2]);
  auto keys = ChainKeys(1, 64);
  std::vector<BlockKey> a, a2, b, c;
  ASSERT_TRUE((*sa)->SaltKeys(keys, &a).ok());
  ASSERT_TRUE((*sa2)->SaltKeys(keys, &a2).ok());
  ASSERT_TRUE((*sb)->SaltKeys(keys, &b).ok());
  ASSERT_TRUE((*sc)->SaltKeys(keys, &c).ok());
  EXPECT_EQ(a, a2);  // stable: a restarted daemon finds the same blocks
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_NE(a[i], keys[i]);
    for (size_t j = 0; j < keys.size(); ++j) {
      EXPECT_NE(a[i], b[j]);  // no key of b lands on any key of a
      EXPECT_NE(a[i], c[j]);  // a shared salt string still differs by tenant name
    }
  }
  EXPECT_NE(*(*sa)->SaltSession(1), *(*sb)->SaltSession(1));
}

TEST(TenantsTest, ConfigIsValidatedAndTokensAuthenticate) {
  EXPECT_EQ(TenantRegistry::Make({{"a", "short", "", 0}}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(TenantRegistry::Make({{"bad name", kTokenA, "", 0}}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(TenantRegistry::Make({{"a", kTokenA, "", 0}, {"b", kTokenA, "", 0}}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(TenantRegistry::Make({{"a", kTokenA, "", 0}, {"a", kTokenB, "", 0}}).status().code(), Code::kInvalidArgument);
  auto reg = TenantRegistry::Make({{"a", kTokenA, "", 0}, {"b", kTokenB, "", 0}});
  ASSERT_TRUE(reg.ok());
  EXPECT_EQ((*(*reg)->Authenticate(kTokenB))->name, "b");
  EXPECT_EQ((*reg)->Authenticate("").status().code(), Code::kPermissionDenied);
  auto implicit = TenantRegistry::Make({});
  ASSERT_TRUE(implicit.ok());
  EXPECT_EQ((*(*implicit)->Authenticate(""))->name, "default");
}

// The prompt-leakage attack on a shared prefix cache: tenant b looks up
// prefixes tenant a has cached, hoping a hit (or a faster miss) reveals
// them. Why it cannot work: the daemon salts every key with the asking
// tenant's secret, so a's blocks live at keys b cannot produce; b's lookup
// of a's hashes is an index miss on the same code path, with the same work,
// as a lookup of hashes nobody ever stored. The test checks the mechanism
// (every probe is a miss) and then the timing, with a check that cannot
// flake on a loaded machine: probes of a's prefixes and of never-stored
// prefixes alternate in random order, and a sign test over the pairs must
// not find one kind consistently slower (it would need 80% of pairs to go
// one way; an unbiased coin does that over 300 pairs with probability
// about 1e-27).
TEST(TenantsTest, AnotherTenantsPrefixesLookLikeMissesIncludingInTime) {
  TempDir dir;
  auto server = StartServer(SmallServerConfig(dir.path()));
  ASSERT_NE(server, nullptr);
  auto a = ConnectOrNull(server->unix_address(), kTokenA);
  auto b = ConnectOrNull(server->unix_address(), kTokenB);
  ASSERT_TRUE(a && b);
  constexpr int kChains = 12, kPairs = 300;
  std::vector<std::vector<BlockKey>> cached, fresh;
  for (int i = 0; i < kChains; ++i) {
    cached.push_back(ChainKeys(500 + i, 4));
    fresh.push_back(ChainKeys(900 + i, 4));
    ASSERT_TRUE(a->Put(i, cached.back(), Blocks(a->info().block_bytes, 4, i)).ok());
    ASSERT_EQ(*a->Lookup(cached.back()), 4u);
  }
  std::mt19937 rng(42);
  int cached_slower = 0;
  auto probe = [&](const std::vector<BlockKey>& keys) {
    const auto t0 = Clock::now();
    auto hit = b->Lookup(keys);
    const auto dt = Clock::now() - t0;
    EXPECT_TRUE(hit.ok());
    EXPECT_EQ(hit.ok() ? *hit : 99u, 0u) << "tenant b saw tenant a's prefix";
    return dt;
  };
  for (int i = 0; i < kPairs; ++i) {
    const auto& c = cached[i % kChains];
    const auto& f = fresh[i % kChains];
    Clock::duration tc, tf;
    if (rng() & 1) {
      tc = probe(c);
      tf = probe(f);
    } else {
      tf = probe(f);
      tc = probe(c);
    }
    cached_slower += tc > tf;
  }
  EXPECT_GT(cached_slower, kPairs / 5) << "a's prefixes answer consistently faster for b";
  EXPECT_LT(cached_slower, kPairs * 4 / 5) << "a's prefixes answer consistently slower for b";
}

TEST(TenantsTest, TlsOnTcp) {
  if (std::system("openssl version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no openssl command to make a test certificate";
  TempDir dir;
  const std::string cert = dir.Sub("cert.pem"), key = dir.Sub("key.pem");
  const std::string cmd = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=localhost "
                          "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " + key + " -out " + cert + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  ServerConfig c = SmallServerConfig(dir.path());
  c.tls_cert_file = cert;
  c.tls_key_file = key;
  c.login_timeout = std::chrono::milliseconds(1000);  // bounds the TLS handshake too...
  c.io_timeout = std::chrono::milliseconds(10000);    // ...which io_timeout no longer does
  auto server = StartServer(c);
  ASSERT_NE(server, nullptr);
  ClientOptions o;
  o.token = kTokenA;
  o.tls = true;
  o.tls_ca_file = cert;
  auto client = Client::Connect(server->tcp_address(), o);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto keys = ChainKeys(77, 5);
  auto data = Blocks((*client)->info().block_bytes, keys.size(), 77);
  ASSERT_TRUE((*client)->Put(0, keys, data).ok());
  std::vector<std::byte> out(data.size());
  auto r = (*client)->Restore(keys, out);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->valid_blocks, 5u);
  EXPECT_EQ(0, std::memcmp(out.data(), data.data(), data.size()));
  // Verification is real: the wrong name fails, and so does plain TCP.
  o.tls_server_name = "not-localhost.example";
  EXPECT_FALSE(Client::Connect(server->tcp_address(), o).ok());
  ClientOptions plain;
  plain.token = kTokenA;
  plain.connect_timeout = std::chrono::milliseconds(1000);
  EXPECT_FALSE(Client::Connect(server->tcp_address(), plain).ok());
  // The Unix socket stays plain (local peers only).
  EXPECT_NE(ConnectOrNull(server->unix_address(), kTokenA), nullptr);
  // A peer that never starts its TLS handshake is closed after login_timeout (not io_timeout).
  const auto start = Clock::now();
  const int silent = RawConnect(server->tcp_address());
  ASSERT_GE(silent, 0);
  EXPECT_TRUE(ClosedByPeer(silent));
  const auto took = Clock::now() - start;
  EXPECT_GE(took, std::chrono::milliseconds(900));
  EXPECT_LT(took, std::chrono::milliseconds(4500));
  ::close(silent);
}

}  // namespace
}  // namespace flatkv::service
