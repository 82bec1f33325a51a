// Two daemons as two nodes sharing the local cluster (ctest's RedisCluster
// fixture): the reference engine on node B, whose store has never seen the
// prompt, reuses the prefix node A computed, from the remote tier, and its
// tokens and logits are bit-identical to a run without any store.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "model/model.h"
#include "remote/cluster_test_util.h"
#include "service/remote_store.h"
#include "service/test_server.h"

namespace flatkv::service {
namespace {

using flatkv::testing::TempDir;
using namespace flatkv::service::testing;

TEST(RemoteDaemonsTest, TheEngineOnNodeBReusesThePrefixNodeAComputedBitForBit) {
  const auto seeds = remote::cluster_testing::LocalClusterSeeds();
  if (seeds.empty()) GTEST_SKIP() << "no local cluster (run through ctest)";
  const std::string dir = flatkv::testing::ModelDataDir() + "/";  // bundled: data/models
  auto model = model::LoadLlama2c(dir + "stories260K.bin", dir + "tok512.bin");
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const std::string prefix =
      "fkvt-daemons-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  TempDir tmp_a, tmp_b;
  auto node = [&](const TempDir& tmp) {
    ServerConfig c = SmallServerConfig(tmp.path());
    c.store.shape = engine::Engine::ShapeFor(model->config);
    c.store.block_tokens = 16;
    c.store.remote.seeds = seeds;
    c.store.remote.prefix = prefix;  // both nodes: one namespace on the cluster
    return StartServer(c);
  };
  auto a = node(tmp_a), b = node(tmp_b);
  ASSERT_TRUE(a && b);
  auto client_a = ConnectOrNull(a->unix_address(), kTokenA), client_b = ConnectOrNull(b->unix_address(), kTokenA);
  ASSERT_TRUE(client_a && client_b);
  RemoteStore store_a(std::move(client_a)), store_b(std::move(client_b));

  const std::vector<int> prompt = engine::testing::PatternPrompt(70, 41);
  const engine::EngineOptions eo = engine::testing::SixteenTokenBlocks();
  const engine::GenerateOptions go = engine::testing::SixTokensWithLogits();
  auto cold = engine::testing::ColdRun(*model, prompt);
  ASSERT_TRUE(cold.ok()) << cold.status().ToString();

  auto on_a = engine::Engine::Create(*model, &store_a, eo);
  ASSERT_TRUE(on_a.ok()) << on_a.status().ToString();
  auto first = on_a->Generate(1, prompt, go);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(first->stored_blocks, 4u);  // 4 full blocks of the 69 hashed tokens
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (a->store().Stats().remote.published_blocks < 4 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(a->store().Stats().remote.published_blocks, 4u) << "node A did not publish its blocks";

  auto on_b = engine::Engine::Create(*model, &store_b, eo);
  ASSERT_TRUE(on_b.ok()) << on_b.status().ToString();
  auto second = on_b->Generate(1, prompt, go);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->computed_prompt_tokens, 70u - 64u) << "node B computed only what the prefix lacks";
  EXPECT_EQ(b->store().Stats().remote.restored_blocks, 4u) << "node B took the prefix from the cluster";
  EXPECT_EQ(second->tokens, cold->tokens);
  EXPECT_EQ(second->logits, cold->logits) << "logits differ from the cold run";

  // Node B wrote the prefix back into its own store, and published nothing
  // again: its next restore of it is local.
  EXPECT_EQ(second->stored_blocks, 4u) << "node B did not write the cluster's blocks back";
  const auto republish = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (b->store().Stats().remote.already_published_blocks < 4 && std::chrono::steady_clock::now() < republish)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(b->store().Stats().remote.already_published_blocks, 4u);
  EXPECT_EQ(b->store().Stats().remote.published_blocks, 0u) << "node B wrote node A's blocks to the cluster again";
  auto third = on_b->Generate(2, prompt, go);
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  EXPECT_EQ(third->restored_tokens_remote, 0u);
  EXPECT_EQ(third->restored_tokens_dram + third->restored_tokens_ssd, 64u) << "node B's second restore was not local";
  EXPECT_EQ(third->tokens, cold->tokens);
  EXPECT_EQ(third->logits, cold->logits) << "logits differ from the cold run after the write-back";
}

}  // namespace
}  // namespace flatkv::service
