// The reference engine as a daemon client: through a RemoteStore its
// second request restores the prefix the first one stored, and its tokens
// and logits are bit-identical to a run without any store. A GPU window
// (on the CPU copy backend) restores through it too.
#include "service/remote_store.h"

#include <gtest/gtest.h>

#include <cstring>

#include "engine/engine.h"
#include "gpu/copy_backend.h"
#include "gpu/gpu_window.h"
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

// The daemon sends every layer at once: into device slots reused every two
// layers, each layer is copied over only when the consumer waits for it.
TEST(RemoteStoreTest, AGpuWindowRestoresThroughTheDaemonLayerByLayer) {
  TempDir tmp;
  auto server = StartServer(SmallServerConfig(tmp.path()));
  ASSERT_NE(server, nullptr);
  auto client = ConnectOrNull(server->unix_address(), kTokenA);
  ASSERT_NE(client, nullptr);
  RemoteStore remote(std::move(client));
  const auto keys = flatkv::testing::ChainKeys(11, 6);
  const auto data = flatkv::testing::Payload(remote, keys.size(), 11);
  ASSERT_TRUE(remote.Put(1, keys, data).ok());
  auto backend = gpu::MakeCpuCopyBackend();
  auto w = gpu::GpuWindow::Start(backend.get(), remote, keys, 2);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const uint32_t layers = remote.options().shape.layers;
  const uint64_t lb = remote.BlockLayerBytes();
  std::vector<std::byte> host(keys.size() * lb);
  for (uint32_t l = 0; l < layers; ++l) {
    auto d = (*w)->WaitLayer(l);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    ASSERT_EQ(d->blocks, keys.size());
    ASSERT_TRUE(backend->CopyToHost(host.data(), d->data, host.size()).ok());
    for (uint32_t b = 0; b < keys.size(); ++b)
      ASSERT_EQ(std::memcmp(host.data() + b * lb, data.data() + (uint64_t{b} * layers + l) * lb, lb), 0) << l << "/" << b;
    (*w)->ReleaseLayer(l);
  }
  EXPECT_EQ((*w)->Finish(), keys.size());
  EXPECT_EQ((*w)->Stats().copies, layers);  // one copy a layer: its blocks' destinations are adjacent
}

}  // namespace
}  // namespace flatkv::service
