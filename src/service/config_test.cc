// ServerConfig: defaults, TOML overlay, and clear errors.
#include "service/config.h"

#include <gtest/gtest.h>

#include <cstdlib>

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
  EXPECT_EQ(c.tcp_address, "127.0.0.1:7471");
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

TEST(ServerConfigTest, ErrorsNameTheProblem) {
  ServerConfig c = DefaultServerConfig();
  auto msg = [&](const char* toml) { return ApplyConfigToml(toml, "f.toml", &c).message(); };
  EXPECT_NE(msg("[store]\nbogus = 1\n").find("unknown key 'bogus'"), std::string::npos);
  EXPECT_NE(msg("[store]\nshape = \"NoSuchModel\"\n").find("store.shape"), std::string::npos);
  EXPECT_NE(msg("[store]\ndram_bytes = \"12 parsecs\"\n").find("unknown unit"), std::string::npos);
  EXPECT_NE(msg("[store\n").find("f.toml:1"), std::string::npos);
  ServerConfig remote = DefaultServerConfig();
  remote.tcp_address = "0.0.0.0:7471";
  EXPECT_NE(FinalizeConfig(&remote).message().find("not loopback"), std::string::npos);
  remote.allow_remote = true;
  EXPECT_TRUE(FinalizeConfig(&remote).ok());
  EXPECT_EQ(*ParseByteSize("1.5GiB"), 3ull << 29);
  EXPECT_EQ(*ParseByteSize("10MB"), 10000000u);
}

}  // namespace
}  // namespace flatkv::service
