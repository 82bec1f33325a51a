// Threads sharing one flatkv_store handle, embedded and against a daemon
// (whose handle pools connections and streams layer-by-layer restores on
// worker threads). Built into flatkv_concurrency_tests for ThreadSanitizer.
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "capi/capi_test_util.h"
#include "flatkv/flatkv.h"
#include "service/test_server.h"

namespace flatkv {
namespace {

using capi_testing::Err;

std::vector<flatkv_key> Keys(uint32_t first_token, uint64_t blocks, uint32_t block_tokens) {
  flatkv_namespace* ns = nullptr;
  EXPECT_EQ(Err(flatkv_namespace_create(FLATKV_HASH_XXH3, FLATKV_DEFAULT_HASH_SEED, "m", nullptr, nullptr, &ns)), "");
  std::vector<uint32_t> tokens(blocks * block_tokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = first_token + uint32_t(i);
  std::vector<flatkv_key> keys(blocks);
  uint64_t n = 0;
  EXPECT_EQ(Err(flatkv_namespace_keys(ns, nullptr, tokens.data(), tokens.size(), block_tokens, keys.data(), blocks, &n)),
            "");
  flatkv_namespace_destroy(ns);
  return keys;
}

// Four threads each put their own chain, then restore it repeatedly, whole
// and layer by layer; returns the first error of each thread.
std::vector<std::string> Hammer(flatkv_store* s) {
  const uint64_t bb = flatkv_store_block_bytes(s), lb = flatkv_store_block_layer_bytes(s);
  const uint32_t layers = flatkv_store_layers(s);
  std::vector<std::string> errors(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      auto keys = Keys(10000 * (t + 1), 2, flatkv_store_block_tokens(s));
      auto data = service::testing::Blocks(bb, 2, 100 + t);
      std::string& e = errors[t];
      e = Err(flatkv_store_put(s, 10 + t, keys.data(), 2, data.data(), data.size(), 0));
      std::vector<std::byte> out(data.size());
      for (int i = 0; i < 4 && e.empty(); ++i) {
        uint32_t got = 0;
        e = Err(flatkv_store_restore(s, keys.data(), 2, out.data(), out.size(), FLATKV_LAYOUT_BLOCK_MAJOR, &got));
        if (e.empty() && (got != 2 || out != data)) e = "wrong bytes from a whole restore";
        flatkv_restore* r = nullptr;
        if (e.empty()) e = Err(flatkv_store_restore_start(s, keys.data(), 2, nullptr, 0, FLATKV_LAYOUT_BLOCK_MAJOR, &r));
        for (uint32_t l = 0; l < layers && e.empty(); ++l) {
          const void* view = nullptr;
          uint32_t blocks = 0;
          e = Err(flatkv_restore_wait_layer(r, l, &view, &blocks));
          if (e.empty() && (blocks != 2 || std::memcmp(view, data.data() + l * lb, lb) != 0 ||
                            std::memcmp(static_cast<const std::byte*>(view) + lb, data.data() + bb + l * lb, lb) != 0))
            e = "wrong bytes in layer " + std::to_string(l);
          if (e.empty()) e = Err(flatkv_restore_release_layer(r, l));
        }
        flatkv_restore_destroy(r);
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

TEST(CapiConcurrencyTest, ThreadsShareAnEmbeddedStore) {
  flatkv::testing::TempDir dir;
  flatkv_options* o = flatkv_options_create();
  ASSERT_EQ(Err(flatkv_options_set_shape_mha(o, 3, 2, 16, FLATKV_DTYPE_F16)), "");
  ASSERT_EQ(Err(flatkv_options_set_block_tokens(o, 16)), "");
  ASSERT_EQ(Err(flatkv_options_set_dram_capacity(o, 1 << 20)), "");
  ASSERT_EQ(Err(flatkv_options_add_ssd_dir(o, dir.Sub("ssd").c_str(), 4 << 20)), "");
  ASSERT_EQ(Err(flatkv_options_set_segment_bytes(o, 1 << 20)), "");
  flatkv_store* s = nullptr;
  ASSERT_EQ(Err(flatkv_store_open(o, &s)), "");
  flatkv_options_destroy(o);
  for (const auto& e : Hammer(s)) EXPECT_EQ(e, "");
  flatkv_store_destroy(s);
}

TEST(CapiConcurrencyTest, ThreadsShareADaemonClient) {
  flatkv::testing::TempDir dir;
  auto server = service::testing::StartServer(service::testing::SmallServerConfig(dir.path()));
  ASSERT_NE(server, nullptr);
  for (uint64_t shm : {uint64_t{0}, uint64_t{4} << 20}) {
    flatkv_options* o = flatkv_options_create();
    ASSERT_EQ(Err(flatkv_options_set_server(o, server->unix_address().c_str(), service::testing::kTokenA)), "");
    ASSERT_EQ(Err(flatkv_options_set_shm_window(o, shm)), "");
    flatkv_store* s = nullptr;
    ASSERT_EQ(Err(flatkv_store_open(o, &s)), "");
    flatkv_options_destroy(o);
    for (const auto& e : Hammer(s)) EXPECT_EQ(e, "") << "shm window " << shm;
    flatkv_store_destroy(s);
  }
  EXPECT_TRUE(server->Stop().ok());
}

}  // namespace
}  // namespace flatkv
