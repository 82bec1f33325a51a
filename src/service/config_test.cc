// ServerConfig: defaults, TOML overlay, and clear errors.
#include "service/config.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "common/thread_pool.h"
#include "testing/test_util.h"

namespace flatkv::service {
namespace {

TEST(ServerConfigTest, DefaultsAreLocalAndSized) {
  setenv("XDG_CACHE_HOME", "/tmp/flatkv-config-test-cache", 1);
  ServerConfig c = DefaultServerConfig();
  unsetenv("XDG_CACHE_HOME");
  ASSERT_EQ(c.store.ssd_dirs.size(), 1u);
  EXPECT_EQ(c.store.ssd_dirs[0], "/tmp/flatkv-config-test-cache/flatkv/store");
  EXPECT_EQ(c.store.shape.layers, 32u);
  ASSERT_TRUE(FinalizeConfig(&c).ok());
  EXPECT_GT(c.store.dram_capacity_bytes, 0u);
  EXPECT_LE(c.store.ssd_capacity_bytes, 16ull << 30);
  EXPECT_GT(c.store.ssd_capacity_bytes, 0u);
  EXPECT_EQ(c.tcp_address, "") << "no tenants: only the Unix socket listens";
  ServerConfig with_tenants = DefaultServerConfig();
  with_tenants.tenants = {{"a", "a-token-0123456789abc", "", 0}};
  ASSERT_TRUE(FinalizeConfig(&with_tenants).ok());
  EXPECT_EQ(with_tenants.tcp_address, "127.0.0.1:7471");
}

TEST(ServerConfigTest, DefaultSocketIsInItsOwnDirectory) {
  setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1);
  EXPECT_EQ(DefaultServerConfig().unix_path, "/run/user/4242/flatkv/flatkv.sock");
  unsetenv("XDG_RUNTIME_DIR");
  setenv("XDG_CACHE_HOME", "/tmp/flatkv-config-test-cache", 1);
  EXPECT_EQ(DefaultServerConfig().unix_path, "/tmp/flatkv-config-test-cache/flatkv/run/flatkv.sock");
  unsetenv("XDG_CACHE_HOME");
}

// Every configuration the secure defaults refuse, with a message that says what to set.
TEST(ServerConfigTest, InsecureConfigurationsAreRefusedSayingWhatToSet) {
  auto refusal = [](ServerConfig c) { return FinalizeConfig(&c).message(); };
  auto has = [](const std::string& msg, const char* a, const char* b) {
    return msg.find(a) != std::string::npos && msg.find(b) != std::string::npos;
  };
  const ServerConfig base = DefaultServerConfig();
  const std::vector<TenantConfig> tenants = {{"a", "a-token-0123456789abc", "", 0}};

  ServerConfig tcp = base;  // TCP without tenants
  tcp.tcp_address = "127.0.0.1:7471";
  EXPECT_PRED3(has, refusal(tcp), "listen.tcp '127.0.0.1:7471' needs at least one [[tenants]]", "listen.tcp = \"\"");
  tcp.tenants = tenants;
  EXPECT_EQ(refusal(tcp), "");

  ServerConfig remote = base;  // allow_remote without TLS or tenants
  remote.allow_remote = true;
  remote.tcp_address = "0.0.0.0:7471";
  EXPECT_PRED3(has, refusal(remote), "listen.allow_remote = true needs [tls] cert and key and at least one [[tenants]]",
               "encrypt and authenticate");
  remote.tenants = tenants;
  EXPECT_PRED3(has, refusal(remote), "listen.allow_remote = true needs [tls] cert and key:", "encrypt");
  remote.tenants.clear();
  remote.tls_cert_file = "/c.pem";
  remote.tls_key_file = "/k.pem";
  EXPECT_PRED3(has, refusal(remote), "listen.allow_remote = true needs at least one [[tenants]]", "authenticate");
  remote.tenants = tenants;
  EXPECT_EQ(refusal(remote), "");
  remote.allow_remote = false;
  EXPECT_PRED3(has, refusal(remote), "not loopback", "set listen.allow_remote = true");

  ServerConfig none = base;  // no listener at all
  none.unix_path.clear();
  EXPECT_PRED3(has, refusal(none), "TCP needs tenants", "set listen.unix");
  none.tcp_address.clear();
  none.tenants = tenants;
  EXPECT_PRED3(has, refusal(none), "neither a unix socket nor a tcp address", "set listen.unix or listen.tcp");

  ServerConfig tls = base;
  tls.tls_cert_file = "/c.pem";
  EXPECT_PRED3(has, refusal(tls), "cert and key must be given together", "set both tls.cert and tls.key");

  ServerConfig deadline = base;
  deadline.default_deadline = std::chrono::milliseconds(90000);
  EXPECT_PRED3(has, refusal(deadline), "limits.deadline_ms 90000 exceeds limits.max_deadline_ms 60000",
               "raise max_deadline_ms");
  ServerConfig shm = base;
  shm.max_shm_total_bytes = 1 << 30;
  EXPECT_PRED3(has, refusal(shm), "limits.max_shm_bytes 68719476736 (per connection) exceeds limits.max_shm_total_bytes",
               "raise max_shm_total_bytes");

  // The new [limits] keys, and their range errors.
  ServerConfig c = base;
  ASSERT_TRUE(ApplyConfigToml("[limits]\nlogin_timeout_ms = 250\nmax_unauthenticated_per_peer = 3\nmax_deadline_ms = 5000\n"
                              "max_shm_total_bytes = \"1GiB\"\nmax_shm_bytes = \"512MiB\"\nmax_restore_ms = 700\n"
                              "tenant_pinned_bytes = \"2GiB\"\ndeadline_ms = 1000\n",
                              "f.toml", &c)
                  .ok());
  EXPECT_EQ(c.login_timeout.count(), 250);
  EXPECT_EQ(c.max_unauthenticated_per_peer, 3u);
  EXPECT_EQ(c.max_deadline.count(), 5000);
  EXPECT_EQ(c.max_shm_total_bytes, 1ull << 30);
  EXPECT_EQ(c.max_restore_time.count(), 700);
  EXPECT_EQ(c.tenant_pinned_bytes, 2ull << 30);
  EXPECT_TRUE(FinalizeConfig(&c).ok());
  auto msg = [&](const char* toml) { return ApplyConfigToml(toml, "f.toml", &c).message(); };
  EXPECT_PRED3(has, msg("[limits]\nlogin_timeout_ms = 0\n"), "limits.login_timeout_ms", "0 ms is not positive");
  EXPECT_PRED3(has, msg("[limits]\nmax_unauthenticated_per_peer = 0\n"), "limits.max_unauthenticated_per_peer",
               "0 is outside 1..1048576");
  EXPECT_PRED3(has, msg("[limits]\nmax_restore_ms = \"3s\"\n"), "limits.max_restore_ms", "expected an integer of milliseconds");

  // [server]: the event loops and the workers kept ready.
  EXPECT_EQ(base.loop_threads, DefaultLoopThreads());
  EXPECT_EQ(DefaultLoopThreads(), ThreadPool::HardwareThreads() < 4 ? 1u : 2u);
  EXPECT_EQ(base.workers, 2u);
  ASSERT_TRUE(ApplyConfigToml("[server]\nloop_threads = 4\nworkers = 8\n", "f.toml", &c).ok());
  EXPECT_EQ(c.loop_threads, 4u);
  EXPECT_EQ(c.workers, 8u);
  EXPECT_PRED3(has, msg("[server]\nloop_threads = 0\n"), "server.loop_threads", "0 is outside 1..256");
  EXPECT_PRED3(has, msg("[server]\nthreads = 2\n"), "server", "threads");
}

TEST(ServerConfigTest, TomlOverlaysEverySection) {
  ServerConfig c = DefaultServerConfig();
  const char* toml = R"(
[store]
shape = { kind = "mha", layers = 4, kv_heads = 2, head_dim = 64, dtype = "f16" }
block_tokens = 32
dram_bytes = "64MiB"
ssd_dir = "/tmp/x"
ssd_bytes = 1073741824
[listen]
unix = "/tmp/s.sock"
tcp = "127.0.0.1:9000"
http = ""
[limits]
max_frame_bytes = "8MiB"
deadline_ms = 500
[[tenants]]
name = "alpha"
token = "alpha-token-0123456789"
quota_bytes = "1GiB"
[[tenants]]
name = "beta"
token = "beta-token-01234567890"
salt = "fixed-salt"
)";
  ASSERT_TRUE(ApplyConfigToml(toml, "test.toml", &c).ok());
  ASSERT_TRUE(FinalizeConfig(&c).ok());
  EXPECT_EQ(c.store.shape, KvShape::Mha(4, 2, 64, DType::kF16));
  EXPECT_EQ(c.store.block_tokens, 32u);
  EXPECT_EQ(c.store.dram_capacity_bytes, 64ull << 20);
  EXPECT_EQ(c.store.ssd_capacity_bytes, 1ull << 30);
  EXPECT_EQ(c.store.ssd_dirs, std::vector<std::string>{"/tmp/x"});
  EXPECT_EQ(c.http_address, "");
  EXPECT_EQ(c.max_frame_bytes, 8ull << 20);
  EXPECT_EQ(c.default_deadline.count(), 500);
  ASSERT_EQ(c.tenants.size(), 2u);
  EXPECT_EQ(c.tenants[0].quota_bytes, 1ull << 30);
  EXPECT_EQ(c.tenants[1].salt, "fixed-salt");
}

// [metrics]: tenant names in /metrics are opt-in; /stats wants its own token.
TEST(ServerConfigTest, MetricsSectionIsOptInAndChecksTheStatsToken) {
  ServerConfig c = DefaultServerConfig();
  EXPECT_FALSE(c.metrics_tenant_labels);
  EXPECT_EQ(c.stats_token, "");
  ASSERT_TRUE(
      ApplyConfigToml("[metrics]\ntenant_labels = true\nstats_token = \"stats-token-0123456789\"\n", "f.toml", &c)
          .ok());
  EXPECT_TRUE(c.metrics_tenant_labels);
  EXPECT_EQ(c.stats_token, "stats-token-0123456789");
  EXPECT_NE(ApplyConfigToml("[metrics]\nstats_token = \"short\"\n", "f.toml", &c)
                .message()
                .find("f.toml: metrics.stats_token: a token of 5 characters is too short"),
            std::string::npos);
  EXPECT_NE(ApplyConfigToml("[metrics]\nnames = true\n", "f.toml", &c).message().find("unknown key 'names'"),
            std::string::npos);
  EXPECT_NE(ApplyConfigToml("[metrics]\ntenant_labels = \"yes\"\n", "f.toml", &c).message().find("tenant_labels"),
            std::string::npos);
}

// [remote]: the store's remote tier (StoreOptions::remote), every key.
TEST(ServerConfigTest, RemoteSectionSetsTheRemoteTierAndNamesItsErrors) {
  ServerConfig c = DefaultServerConfig();
  EXPECT_TRUE(c.store.remote.seeds.empty()) << "off by default";
  testing::TempDir dir;
  const std::string secret = dir.Sub("secret");
  std::ofstream(secret) << "s3cret-password\n";
  const std::string toml = R"(
[remote]
seeds = ["10.0.0.1:7000", "redis-2.internal:7001"]
user = "flatkv-node-a"
password_file = ")" + secret + R"("
tls = true
tls_ca_file = "/etc/flatkv/ca.crt"
tls_verify = false
prefix = "fkv-a"
object_bytes = "2MiB"
max_inflight = 16
ttl_seconds = 3600
timeout_ms = 250
publish_buffer_bytes = "128MiB"
backoff_ms = 2000
capacity_bytes = "40GiB"
)";
  ASSERT_TRUE(ApplyConfigToml(toml, "r.toml", &c).ok()) << ApplyConfigToml(toml, "r.toml", &c).ToString();
  const RemoteOptions& r = c.store.remote;
  EXPECT_EQ(r.seeds, (std::vector<std::string>{"10.0.0.1:7000", "redis-2.internal:7001"}));
  EXPECT_EQ(r.user, "flatkv-node-a");
  EXPECT_EQ(r.password, "s3cret-password");
  EXPECT_TRUE(r.tls);
  EXPECT_EQ(r.tls_ca_file, "/etc/flatkv/ca.crt");
  EXPECT_FALSE(r.tls_verify);
  EXPECT_EQ(r.prefix, "fkv-a");
  EXPECT_EQ(r.object_bytes, 2ull << 20);
  EXPECT_EQ(r.max_inflight, 16u);
  EXPECT_EQ(r.ttl_seconds, 3600u);
  EXPECT_EQ(r.timeout.count(), 250);
  EXPECT_EQ(r.publish_buffer_bytes, 128ull << 20);
  EXPECT_EQ(r.backoff.count(), 2000);
  EXPECT_EQ(r.capacity_bytes, 40ull << 30);
  auto msg = [&](const std::string& t) { return ApplyConfigToml(t, "f.toml", &c).message(); };
  EXPECT_NE(msg("[remote]\nseeds = \"10.0.0.1:7000\"\n").find("remote.seeds: expected an array"), std::string::npos);
  EXPECT_NE(msg("[remote]\nseeds = [\"nohost\"]\n").find("host:port"), std::string::npos);
  EXPECT_NE(msg("[remote]\nprefix = \"a{b}\"\n").find("no hash tags"), std::string::npos);
  EXPECT_NE(msg("[remote]\nobject_bytes = 10\n").find("outside 4KiB..64MiB"), std::string::npos);
  EXPECT_NE(msg("[remote]\nmax_inflight = 0\n").find("remote.max_inflight: 0 is outside 1..1024"), std::string::npos);
  EXPECT_NE(msg("[remote]\npassword = \"x\"\npassword_file = \"/y\"\n").find("keep one"), std::string::npos);
  EXPECT_NE(msg("[remote]\npassword_file = \"/nonexistent/pw\"\n").find("cannot read /nonexistent/pw"), std::string::npos);
  EXPECT_NE(msg("[remote]\nseed = []\n").find("unknown key 'seed'"), std::string::npos);
  EXPECT_EQ(c.store.remote.prefix, "fkv-a") << "a table with an error changes nothing";
}

TEST(ServerConfigTest, ErrorsNameTheProblem) {
  ServerConfig c = DefaultServerConfig();
  auto msg = [&](const char* toml) { return ApplyConfigToml(toml, "f.toml", &c).message(); };
  EXPECT_NE(msg("[store]\nbogus = 1\n").find("unknown key 'bogus'"), std::string::npos);
  EXPECT_NE(msg("[store]\nshape = \"NoSuchModel\"\n").find("store.shape"), std::string::npos);
  EXPECT_NE(msg("[store]\ndram_bytes = \"12 parsecs\"\n").find("unknown unit"), std::string::npos);
  EXPECT_NE(msg("[store\n").find("f.toml:1"), std::string::npos);
  ServerConfig remote = DefaultServerConfig();
  remote.tcp_address = "0.0.0.0:7471";
  remote.tenants = {{"a", "a-token-0123456789abc", "", 0}};
  EXPECT_NE(FinalizeConfig(&remote).message().find("not loopback"), std::string::npos);
  remote.allow_remote = true;
  remote.tls_cert_file = "/c.pem";
  remote.tls_key_file = "/k.pem";
  EXPECT_TRUE(FinalizeConfig(&remote).ok());
  EXPECT_EQ(*ParseByteSize("1.5GiB"), 3ull << 29);
  EXPECT_EQ(*ParseByteSize("10MB"), 10000000u);
}


TEST(ServerConfigTest, TomlSetsEveryStoreKnob) {
  ServerConfig c = DefaultServerConfig();
  const char* toml = R"(
[store]
block_tokens = 128
segment_bytes = "512MiB"
dram_extent_layer_bytes = "512KiB"
ssd_extent_layer_bytes = 4194304
session_dram_share_bytes = "1GiB"
dram_idle_after_ms = 30000
ssd_admission = "on-reuse"
readmit_on_restore = false
ssd_write_buffer_bytes = "256MiB"
window_layers = 8
window_bytes = "64MiB"
ssd_layers_in_flight = 6
max_request_bytes = "8MiB"
io = "threadpool"
ssd_queue_depth = 64
ssd_threads = 6
dram_threads = 3
decode_threads = 5
use_direct_io = false
sync_writes = true
verify_dram_reads = true
)";
  ASSERT_TRUE(ApplyConfigToml(toml, "knobs.toml", &c).ok()) << ApplyConfigToml(toml, "knobs.toml", &c).ToString();
  ASSERT_TRUE(FinalizeConfig(&c).ok());
  const StoreOptions& o = c.store;
  EXPECT_EQ(o.block_tokens, 128u);
  EXPECT_EQ(o.segment_bytes, 512ull << 20);
  EXPECT_EQ(o.dram_extent_layer_bytes, 512ull << 10);
  EXPECT_EQ(o.ssd_extent_layer_bytes, 4ull << 20);
  EXPECT_EQ(o.session_dram_share_bytes, 1ull << 30);
  EXPECT_EQ(o.dram_idle_after, std::chrono::milliseconds(30000));
  EXPECT_EQ(o.ssd_admission, SsdAdmission::kOnReuse);
  EXPECT_FALSE(o.readmit_on_restore);
  EXPECT_EQ(o.ssd_write_buffer_bytes, 256ull << 20);
  EXPECT_EQ(o.window_layers, 8u);
  EXPECT_EQ(o.window_bytes, 64ull << 20);
  EXPECT_EQ(o.ssd_layers_in_flight, 6u);
  EXPECT_EQ(o.max_request_bytes, 8ull << 20);
  EXPECT_EQ(o.ssd_io, IoEngineKind::kThreadPool);
  EXPECT_EQ(o.ssd_queue_depth, 64u);
  EXPECT_EQ(o.ssd_threads, 6u);
  EXPECT_EQ(o.dram_threads, 3u);
  EXPECT_EQ(o.decode_threads, 5u);
  EXPECT_FALSE(o.use_direct_io);
  EXPECT_TRUE(o.sync_writes);
  EXPECT_TRUE(o.verify_dram_reads);
  // --print-config shows them as TOML.
  EXPECT_EQ(StoreKnobValue("ssd_admission", c), "\"on-reuse\"");
  EXPECT_EQ(StoreKnobValue("dram_idle_after_ms", c), "30000");
  EXPECT_EQ(StoreKnobValue("readmit_on_restore", c), "false");
  EXPECT_EQ(StoreKnobValue("session_dram_share_bytes", c), std::to_string(1ull << 30));
}

// The daemon keeps the store's own defaults, derived ones (0) included: only
// the capacities, the shape and the directory are its own.
TEST(ServerConfigTest, DaemonKeepsTheStoresDefaults) {
  ServerConfig c = DefaultServerConfig();
  ASSERT_TRUE(FinalizeConfig(&c).ok());
  EXPECT_EQ(c.store.session_dram_share_bytes, 0u);
  EXPECT_EQ(c.store.ssd_write_buffer_bytes, 0u);
  ServerConfig plain;
  plain.store = StoreOptions{};
  for (const auto& k : StoreKnobs()) EXPECT_EQ(StoreKnobValue(k.key, c), StoreKnobValue(k.key, plain)) << k.key;
  // Setting a derived knob back to 0 means derived again.
  ASSERT_TRUE(ApplyConfigToml("[store]\nsession_dram_share_bytes = \"2GiB\"\n", "a.toml", &c).ok());
  ASSERT_TRUE(ApplyConfigToml("[store]\nsession_dram_share_bytes = 0\n", "b.toml", &c).ok());
  ASSERT_TRUE(FinalizeConfig(&c).ok());
  EXPECT_EQ(c.store.session_dram_share_bytes, 0u);
}

TEST(ServerConfigTest, KnobErrorsNameTheKeyAndTheValue) {
  ServerConfig c = DefaultServerConfig();
  auto msg = [&](const std::string& body) { return ApplyConfigToml("[store]\n" + body + "\n", "f.toml", &c).message(); };
  auto has = [](const std::string& m, const char* a, const char* b) {
    return m.find(a) != std::string::npos && m.find(b) != std::string::npos;
  };
  EXPECT_PRED3(has, msg("session_dram_share_bytes = -1"), "store.session_dram_share_bytes", "negative size -1");
  EXPECT_PRED3(has, msg("ssd_write_buffer_bytes = \"3 bananas\""), "store.ssd_write_buffer_bytes", "3 bananas");
  EXPECT_PRED3(has, msg("window_bytes = true"), "store.window_bytes", "got true");
  EXPECT_PRED3(has, msg("dram_idle_after_ms = -5"), "store.dram_idle_after_ms", "negative duration -5");
  EXPECT_PRED3(has, msg("dram_idle_after_ms = \"600s\""), "store.dram_idle_after_ms", "got '600s'");
  EXPECT_PRED3(has, msg("ssd_admission = \"sometimes\""), "store.ssd_admission", "'sometimes' is not one of all, on-reuse");
  EXPECT_PRED3(has, msg("ssd_admission = 1"), "store.ssd_admission", "got 1");
  EXPECT_PRED3(has, msg("readmit_on_restore = \"yes\""), "store.readmit_on_restore", "got 'yes'");
  EXPECT_PRED3(has, msg("window_layers = -3"), "store.window_layers", "-3 is outside 0..4294967295");
  EXPECT_PRED3(has, msg("ssd_threads = 5000000000"), "store.ssd_threads", "5000000000 is outside");
  EXPECT_PRED3(has, msg("decode_threads = 1.5"), "store.decode_threads", "got 1.5");
  EXPECT_PRED3(has, msg("io = \"dma\""), "store.io", "'dma' is not one of auto, uring, threadpool");
  EXPECT_PRED3(has, msg("ssd_dirs = \"/one/dir\""), "store.ssd_dirs", "/one/dir");
  // A failed key leaves the knob as it was.
  EXPECT_EQ(c.store.ssd_admission, SsdAdmission::kAll);
}

TEST(ServerConfigTest, FlagsSetEveryKindOfKnob) {
  ServerConfig c = DefaultServerConfig();
  ASSERT_TRUE(ApplyStoreKnobFlag("session_dram_share_bytes", "1.5GiB", &c).ok());
  ASSERT_TRUE(ApplyStoreKnobFlag("window_layers", "6", &c).ok());
  ASSERT_TRUE(ApplyStoreKnobFlag("readmit_on_restore", "false", &c).ok());
  ASSERT_TRUE(ApplyStoreKnobFlag("dram_idle_after_ms", "1500", &c).ok());
  ASSERT_TRUE(ApplyStoreKnobFlag("ssd_admission", "on-reuse", &c).ok());
  ASSERT_TRUE(ApplyStoreKnobFlag("io", "uring", &c).ok());
  EXPECT_EQ(c.store.session_dram_share_bytes, 3ull << 29);
  EXPECT_EQ(c.store.window_layers, 6u);
  EXPECT_FALSE(c.store.readmit_on_restore);
  EXPECT_EQ(c.store.dram_idle_after, std::chrono::milliseconds(1500));
  EXPECT_EQ(c.store.ssd_admission, SsdAdmission::kOnReuse);
  EXPECT_EQ(c.store.ssd_io, IoEngineKind::kUring);
  auto msg = [&](const char* key, const char* value) { return ApplyStoreKnobFlag(key, value, &c).message(); };
  EXPECT_NE(msg("session_dram_share_bytes", "-1").find("--session-dram-share-bytes: size '-1'"), std::string::npos);
  EXPECT_NE(msg("window_layers", "six").find("--window-layers: 'six' is not an integer"), std::string::npos);
  EXPECT_NE(msg("window_layers", "-1").find("--window-layers: -1 is outside"), std::string::npos);
  EXPECT_NE(msg("readmit_on_restore", "maybe").find("--readmit-on-restore: 'maybe' is neither"), std::string::npos);
  EXPECT_NE(msg("dram_idle_after_ms", "-2").find("--dram-idle-after-ms: negative duration -2"), std::string::npos);
  EXPECT_NE(msg("ssd_admission", "never").find("--ssd-admission: ssd_admission 'never'"), std::string::npos);
  EXPECT_NE(msg("no_such_knob", "1").find("--no-such-knob"), std::string::npos);
  // The flag each knob is named by (`flatkv serve` registers these) is the one its errors name.
  for (const auto& k : StoreKnobs()) {
    EXPECT_EQ(k.flag.find('_'), std::string::npos) << k.flag;
    EXPECT_NE(msg(std::string(k.key).c_str(), "\x01").find(k.flag + ":"), std::string::npos) << k.key;
  }
  // The failed flags changed nothing.
  EXPECT_EQ(c.store.window_layers, 6u);
  EXPECT_EQ(c.store.ssd_admission, SsdAdmission::kOnReuse);
}

}  // namespace
}  // namespace flatkv::service
