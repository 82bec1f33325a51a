// The C API against a daemon: a Server started in this process on a
// temporary directory, reached through flatkv_options_set_server over the
// Unix socket (with and without a shared-memory window) and TCP.
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "capi/capi_test_util.h"
#include "flatkv/flatkv.h"
#include "service/test_server.h"

namespace flatkv {
namespace {

using service::testing::kTokenA;
using service::testing::kTokenB;

using capi_testing::Err;

class CapiRemoteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = service::testing::StartServer(service::testing::SmallServerConfig(dir_.path()));
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    for (auto* s : stores_) flatkv_store_destroy(s);
    if (server_) {
      EXPECT_TRUE(server_->Stop().ok());
    }
  }

  flatkv_store* Open(const std::string& address, const char* token, uint64_t shm_bytes = 0) {
    flatkv_options* o = flatkv_options_create();
    EXPECT_EQ(Err(flatkv_options_set_server(o, address.c_str(), token)), "");
    EXPECT_EQ(Err(flatkv_options_set_shm_window(o, shm_bytes)), "");
    flatkv_store* s = nullptr;
    EXPECT_EQ(Err(flatkv_store_open(o, &s)), "");
    flatkv_options_destroy(o);
    if (s) stores_.push_back(s);
    return s;
  }

  std::vector<flatkv_key> Keys(uint32_t first_token, uint64_t blocks, const char* model = "m") {
    flatkv_namespace* ns = nullptr;
    EXPECT_EQ(Err(flatkv_namespace_create(FLATKV_HASH_XXH3, FLATKV_DEFAULT_HASH_SEED, model, nullptr, nullptr, &ns)), "");
    std::vector<uint32_t> tokens(blocks * 64);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = first_token + uint32_t(i);
    std::vector<flatkv_key> keys(blocks);
    uint64_t n = 0;
    EXPECT_EQ(Err(flatkv_namespace_keys(ns, nullptr, tokens.data(), tokens.size(), 64, keys.data(), blocks, &n)), "");
    flatkv_namespace_destroy(ns);
    return keys;
  }

  // Every restore path of `s` returns `data` for `keys`.
  void CheckRestores(flatkv_store* s, const std::vector<flatkv_key>& keys, const std::vector<std::byte>& data) {
    const uint64_t n = keys.size(), bb = flatkv_store_block_bytes(s), lb = flatkv_store_block_layer_bytes(s);
    const uint32_t layers = flatkv_store_layers(s);
    std::vector<std::byte> out(n * bb);
    uint32_t got = 0;
    ASSERT_EQ(Err(flatkv_store_restore(s, keys.data(), n, out.data(), out.size(), FLATKV_LAYOUT_BLOCK_MAJOR, &got)), "");
    EXPECT_EQ(got, n);
    EXPECT_EQ(out, data);

    std::fill(out.begin(), out.end(), std::byte{0});
    ASSERT_EQ(Err(flatkv_store_restore(s, keys.data(), n, out.data(), out.size(), FLATKV_LAYOUT_LAYER_MAJOR, &got)), "");
    EXPECT_EQ(got, n);
    for (uint32_t l = 0; l < layers; ++l)
      for (uint64_t b = 0; b < n; ++b)
        EXPECT_EQ(std::memcmp(out.data() + (l * n + b) * lb, data.data() + b * bb + l * lb, lb), 0) << l << " " << b;

    // Layer by layer, without a destination: views of the stream or the window.
    flatkv_restore* r = nullptr;
    ASSERT_EQ(Err(flatkv_store_restore_start(s, keys.data(), n, nullptr, 0, FLATKV_LAYOUT_BLOCK_MAJOR, &r)), "");
    EXPECT_EQ(flatkv_restore_hit_blocks(r), n);
    for (uint32_t l = 0; l < layers; ++l) {
      const void* view = nullptr;
      uint32_t blocks = 0;
      ASSERT_EQ(Err(flatkv_restore_wait_layer(r, l, &view, &blocks)), "");
      ASSERT_EQ(blocks, n);
      ASSERT_NE(view, nullptr);
      for (uint64_t b = 0; b < n; ++b)
        EXPECT_EQ(std::memcmp(static_cast<const std::byte*>(view) + b * lb, data.data() + b * bb + l * lb, lb), 0);
      EXPECT_EQ(Err(flatkv_restore_release_layer(r, l)), "");
    }
    EXPECT_EQ(Err(flatkv_restore_finish(r, &got)), "");
    EXPECT_EQ(got, n);
    flatkv_restore_destroy(r);

    // Layer by layer into caller memory.
    std::fill(out.begin(), out.end(), std::byte{0});
    ASSERT_EQ(Err(flatkv_store_restore_start(s, keys.data(), n, out.data(), out.size(), FLATKV_LAYOUT_BLOCK_MAJOR, &r)),
              "");
    for (uint32_t l = 0; l < layers; ++l) {
      uint32_t blocks = 0;
      ASSERT_EQ(Err(flatkv_restore_wait_layer(r, l, nullptr, &blocks)), "");
      EXPECT_EQ(blocks, n);
    }
    EXPECT_EQ(Err(flatkv_restore_finish(r, &got)), "");
    flatkv_restore_destroy(r);
    EXPECT_EQ(out, data);
  }

  flatkv::testing::TempDir dir_;
  std::unique_ptr<service::Server> server_;
  std::vector<flatkv_store*> stores_;
};

TEST_F(CapiRemoteTest, RoundTripOverSocketTcpAndSharedMemory) {
  flatkv_store* s = Open(server_->unix_address(), kTokenA);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(flatkv_store_layers(s), 5u);
  EXPECT_EQ(flatkv_store_block_tokens(s), 64u);
  EXPECT_EQ(flatkv_store_block_layer_bytes(s), 16384u);
  const uint64_t bb = flatkv_store_block_bytes(s);
  auto keys = Keys(1, 6);
  auto data = service::testing::Blocks(bb, 6, 7);
  uint32_t hit = 9;
  EXPECT_EQ(Err(flatkv_store_match(s, keys.data(), keys.size(), &hit)), "");
  EXPECT_EQ(hit, 0u);
  ASSERT_EQ(Err(flatkv_store_put(s, 1, keys.data(), keys.size(), data.data(), data.size(), 0)), "");
  EXPECT_EQ(Err(flatkv_store_match(s, keys.data(), keys.size(), &hit)), "");
  EXPECT_EQ(hit, 6u);
  CheckRestores(s, keys, data);

  flatkv_store* tcp = Open(server_->tcp_address(), kTokenA);
  ASSERT_NE(tcp, nullptr);
  CheckRestores(tcp, keys, data);

  flatkv_store* shm = Open(server_->unix_address(), kTokenA, 8 << 20);
  ASSERT_NE(shm, nullptr);
  CheckRestores(shm, keys, data);
  // A restore larger than the window goes over the socket.
  flatkv_store* small_shm = Open(server_->unix_address(), kTokenA, 64 << 10);
  ASSERT_NE(small_shm, nullptr);
  CheckRestores(small_shm, keys, data);

  flatkv_stats st;
  EXPECT_EQ(Err(flatkv_store_stats(s, &st)), "");
  EXPECT_GE(st.put_blocks, 6u);
  // The window path really carried bytes (the daemon counts them per tenant).
  uint64_t needed = 0;
  EXPECT_EQ(Err(flatkv_store_stats_json(s, nullptr, 0, &needed)), "");
  std::string json(needed, '\0');
  EXPECT_EQ(Err(flatkv_store_stats_json(s, json.data(), needed, &needed)), "");
  json.resize(needed - 1);
  auto j = nlohmann::json::parse(json);
  ASSERT_TRUE(j["tenants"].is_array());
  for (const auto& t : j["tenants"])
    if (t["name"] == "a") {
      EXPECT_GT(t["restore_bytes_shm"].get<uint64_t>(), 0u);
      EXPECT_GT(t["restore_bytes_stream"].get<uint64_t>(), 0u);
    }
}

// A daemon that restarts (here a clean stop; a kill -9 closes the sockets the same way) costs
// its clients no failed call: the pool drops the connections the old daemon closed while they
// were idle and connects anew. Its SSD still holds the blocks.
TEST_F(CapiRemoteTest, ADaemonRestartCostsNoFailedCall) {
  flatkv_store* plain = Open(server_->unix_address(), kTokenA);
  flatkv_store* shm = Open(server_->unix_address(), kTokenA, 8 << 20);
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(shm, nullptr);
  const uint64_t bb = flatkv_store_block_bytes(plain);
  auto keys = Keys(1, 6);
  auto data = service::testing::Blocks(bb, 6, 7);
  ASSERT_EQ(Err(flatkv_store_put(plain, 1, keys.data(), keys.size(), data.data(), data.size(), 0)), "");
  uint32_t hit = 0;
  EXPECT_EQ(Err(flatkv_store_match(shm, keys.data(), keys.size(), &hit)), "");
  EXPECT_EQ(hit, 6u);

  ASSERT_TRUE(server_->Stop().ok());
  server_ = service::testing::StartServer(service::testing::SmallServerConfig(dir_.path()));
  ASSERT_NE(server_, nullptr);

  for (flatkv_store* s : {plain, shm}) {
    hit = 0;
    EXPECT_EQ(Err(flatkv_store_match(s, keys.data(), keys.size(), &hit)), "");  // the first call
    EXPECT_EQ(hit, 6u);
    CheckRestores(s, keys, data);
  }
}

TEST_F(CapiRemoteTest, TenantsAreIsolatedAndErrorsCarryMessages) {
  flatkv_store* a = Open(server_->unix_address(), kTokenA);
  flatkv_store* b = Open(server_->unix_address(), kTokenB);
  ASSERT_TRUE(a && b);
  auto keys = Keys(100, 3);
  auto data = service::testing::Blocks(flatkv_store_block_bytes(a), 3, 9);
  ASSERT_EQ(Err(flatkv_store_put(a, 1, keys.data(), 3, data.data(), data.size(), 0)), "");
  uint32_t hit = 9;
  EXPECT_EQ(Err(flatkv_store_match(b, keys.data(), 3, &hit)), "");
  EXPECT_EQ(hit, 0u);  // the same keys from another tenant reach nothing
  std::vector<std::byte> out(data.size());
  EXPECT_EQ(Err(flatkv_store_restore(b, keys.data(), 3, out.data(), out.size(), FLATKV_LAYOUT_BLOCK_MAJOR, &hit)), "");
  EXPECT_EQ(hit, 0u);

  EXPECT_NE(Err(flatkv_store_put(a, 1, keys.data(), 3, data.data(), data.size() - 1, 0)).find("expected 3 blocks"),
            std::string::npos);
  // Dropping a session over the daemon: another tenant's session 1 is another session.
  EXPECT_NE(Err(flatkv_store_drop_session(b, 1)).find("NotFound"), std::string::npos);
  EXPECT_EQ(Err(flatkv_store_match(a, keys.data(), 3, &hit)), "");
  EXPECT_EQ(hit, 3u);
  // Retain and truncate through the daemon, in tenant a's namespace.
  uint32_t n = 9;
  EXPECT_EQ(Err(flatkv_store_retain(a, keys.data(), 3, 60000, &n)), "");
  EXPECT_EQ(n, 3u);
  EXPECT_EQ(Err(flatkv_store_retain(b, keys.data(), 3, 60000, &n)), "");
  EXPECT_EQ(n, 0u);
  EXPECT_EQ(Err(flatkv_store_retain(a, keys.data(), 3, 0, nullptr)), "InvalidArgument: flatkv_store_retain: n_retained is NULL");
  EXPECT_EQ(Err(flatkv_store_truncate_session(a, 1, 1, &n)), "");
  EXPECT_EQ(n, 2u);
  EXPECT_EQ(Err(flatkv_store_match(a, keys.data(), 3, &hit)), "");
  EXPECT_EQ(hit, 1u);
  EXPECT_NE(Err(flatkv_store_truncate_session(b, 1, 0, nullptr)).find("NotFound"), std::string::npos);
  EXPECT_EQ(Err(flatkv_store_drop_session(a, 1)), "");
  EXPECT_EQ(Err(flatkv_store_match(a, keys.data(), 3, &hit)), "");
  EXPECT_EQ(hit, 0u);

  flatkv_options* o = flatkv_options_create();
  ASSERT_EQ(Err(flatkv_options_set_server(o, server_->unix_address().c_str(), "not-a-valid-token-at-all")), "");
  flatkv_store* s = nullptr;
  const std::string denied = Err(flatkv_store_open(o, &s));
  EXPECT_EQ(denied.rfind("PermissionDenied: flatkv_store_open", 0), 0u) << denied;
  EXPECT_EQ(s, nullptr);
  ASSERT_EQ(Err(flatkv_options_set_server(o, ("unix:" + dir_.Sub("nothing.sock")).c_str(), kTokenA)), "");
  const std::string refused = Err(flatkv_store_open(o, &s));
  EXPECT_EQ(refused.rfind("IoError: flatkv_store_open", 0), 0u) << refused;
  flatkv_options_destroy(o);

  EXPECT_EQ(Err(flatkv_store_close(a)), "");
  EXPECT_EQ(Err(flatkv_store_match(a, keys.data(), 3, &hit)).rfind("FailedPrecondition", 0), 0u);
}

}  // namespace
}  // namespace flatkv

// The chunk calls through a daemon: the geometry (shape, dtype) comes from
// the daemon, a chunk put by one client is found and re-rotated for
// another, and the tenant salt keeps it from a second tenant.
namespace flatkv {
namespace {

TEST_F(CapiRemoteTest, ChunksThroughTheDaemon) {
  flatkv_store* a = Open(server_->unix_address(), kTokenA);
  flatkv_store* a_tcp = Open(server_->tcp_address(), kTokenA);
  flatkv_store* b = Open(server_->unix_address(), kTokenB);
  ASSERT_TRUE(a && a_tcp && b);
  flatkv_namespace* ns = nullptr;
  ASSERT_EQ(Err(flatkv_namespace_create(FLATKV_HASH_XXH3, FLATKV_DEFAULT_HASH_SEED, "m", nullptr, nullptr, &ns)), "");
  const uint64_t n = 100, tlb = flatkv_store_token_layer_bytes(a), layers = flatkv_store_layers(a);
  EXPECT_EQ(tlb * 64, flatkv_store_block_layer_bytes(a));  // stories260K: f32, 2 x 4 heads x 8
  std::vector<uint32_t> tokens(n);
  for (uint64_t i = 0; i < n; ++i) tokens[i] = 7 + uint32_t(i * 3);
  std::vector<float> rows(layers * n * tlb / sizeof(float));
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = float(i % 97) / 13.0f - 3.0f;
  ASSERT_EQ(Err(flatkv_store_put_chunk(a, ns, tokens.data(), n, rows.data(), rows.size() * 4, 0)), "");
  const flatkv_chunk whole = {0, n};
  uint64_t cached = 0;
  EXPECT_EQ(Err(flatkv_store_lookup_chunks(a_tcp, ns, tokens.data(), n, &whole, 1, &cached)), "");
  EXPECT_EQ(cached, n);
  EXPECT_EQ(Err(flatkv_store_lookup_chunks(b, ns, tokens.data(), n, &whole, 1, &cached)), "");
  EXPECT_EQ(cached, 0u) << "another tenant must not see tenant a's chunk";
  // Re-rotated over TCP: the rows as an embedded re-rotation gives them.
  const flatkv_rope rope = {10000.0, 0, FLATKV_ROPE_INTERLEAVED};
  std::vector<float> remote(rows.size()), plain(rows.size());
  uint64_t restored = 0;
  ASSERT_EQ(Err(flatkv_store_restore_chunk(a_tcp, ns, tokens.data(), n, &rope, 300, remote.data(), remote.size() * 4,
                                           &restored)), "");
  EXPECT_EQ(restored, n);
  ASSERT_EQ(Err(flatkv_store_restore_chunk(a, ns, tokens.data(), n, nullptr, 0, plain.data(), plain.size() * 4,
                                           &restored)), "");
  EXPECT_EQ(plain, rows);
  const uint64_t kv = tlb / 2 / sizeof(float);
  EXPECT_NE(std::memcmp(remote.data(), rows.data(), n * kv * 4), 0) << "K must be rotated";
  EXPECT_EQ(std::memcmp(remote.data() + n * kv, rows.data() + n * kv, n * kv * 4), 0) << "V must be as stored";
  // The chunk is a session of its own: dropping it frees it.
  flatkv_key first;
  uint64_t nk = 0;
  ASSERT_EQ(Err(flatkv_namespace_chunk_keys(ns, tokens.data(), n, 64, &first, 1, &nk)), "InvalidArgument: flatkv_namespace_chunk_keys: 100 tokens make 2 chunk blocks of 64, keys holds 1");
  std::vector<flatkv_key> keys(2);
  ASSERT_EQ(Err(flatkv_namespace_chunk_keys(ns, tokens.data(), n, 64, keys.data(), 2, &nk)), "");
  EXPECT_EQ(Err(flatkv_store_drop_session(a, flatkv_chunk_session(keys[0]))), "");
  EXPECT_EQ(Err(flatkv_store_lookup_chunks(a, ns, tokens.data(), n, &whole, 1, &cached)), "");
  EXPECT_EQ(cached, 0u);
  // Prefetch through the daemon answers with the blocks found.
  std::vector<flatkv_key> chain(3);
  ASSERT_EQ(Err(flatkv_namespace_keys(ns, nullptr, tokens.data(), 64 + 36, 64, chain.data(), 3, &nk)), "");
  uint32_t found = 9;
  EXPECT_EQ(Err(flatkv_store_prefetch(a, chain.data(), nk, &found)), "");
  EXPECT_EQ(found, 0u);
  EXPECT_EQ(Err(flatkv_store_prefetch(a, chain.data(), nk, nullptr)), "InvalidArgument: flatkv_store_prefetch: n_found is NULL");
  flatkv_namespace_destroy(ns);
}

}  // namespace
}  // namespace flatkv
