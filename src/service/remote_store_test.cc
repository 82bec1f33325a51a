// The reference engine as a daemon client: through a RemoteStore its
// second request restores the prefix the first one stored, and its tokens
// and logits are bit-identical to a run without any store.
#include "service/remote_store.h"

#include <gtest/gtest.h>

#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "model/model.h"
#include "service/test_server.h"

namespace flatkv::service {
namespace {

using flatkv::testing::TempDir;
using namespace flatkv::service::testing;

TEST(RemoteStoreTest, ReferenceEngineReusesKvThroughTheDaemon) {
  const std::string dir = flatkv::testing::ModelDataDir() + "/";  // bundled: data/models
  auto model = model::LoadLlama2c(dir + "stories260K.bin", dir + "tok512.bin");
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  TempDir tmp;
  ServerConfig c = SmallServerConfig(tmp.path());
  c.store.shape = engine::Engine::ShapeFor(model->config);
  c.store.block_tokens = 16;
  auto server = StartServer(c);
  ASSERT_NE(server, nullptr);
  auto client = ConnectOrNull(server->unix_address(), kTokenA);
  ASSERT_NE(client, nullptr);
  RemoteStore remote(std::move(client));

  const std::vector<int> prompt = engine::testing::PatternPrompt(70, 37);
  const engine::EngineOptions eo = engine::testing::SixteenTokenBlocks();
  const engine::GenerateOptions go = engine::testing::SixTokensWithLogits();
  auto cold = engine::testing::ColdRun(*model, prompt);
  ASSERT_TRUE(cold.ok()) << cold.status().ToString();

  auto e = engine::Engine::Create(*model, &remote, eo);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  auto first = e->Generate(1, prompt, go);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_GT(first->stored_blocks, 0u);
  auto second = e->Generate(2, prompt, go);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->restored_tokens_dram + second->restored_tokens_ssd, 64u);  // 4 full blocks of the 69 hashed tokens
  EXPECT_EQ(second->tokens, cold->tokens);
  EXPECT_EQ(second->logits, cold->logits);
  EXPECT_EQ(first->tokens, cold->tokens);
}

}  // namespace
}  // namespace flatkv::service
