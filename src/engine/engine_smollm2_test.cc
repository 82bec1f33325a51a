// Reuse on a real model (issue 31, item 4): SmolLM2-135M-Instruct (30
// layers, GQA 9/3, head_dim 64) gives bit-identical tokens and logits cold,
// warm from DRAM and warm from SSD, embedded (the engine over a Store) and
// through the daemon (service::Server, what `flatkv serve` runs, reached
// over its Unix socket by a RemoteStore); and a prompt prefilled in chunks of
// any size gives what one whole prefill gives.
//
// The prompt is real text (the start of docs/architecture.md) tokenized by
// the model's own tokenizer, without BOS. The model file is
// build/models/SmolLM2-135M-Instruct.Q4_1.gguf ($FLATKV_SMOLLM2 overrides):
// without it every test here skips, naming the file and
// `scripts/install-deps.sh models`; with CI=true it fails instead. Built in
// the Release stage only (CMakeLists.txt: *_smollm2_test.cc).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "flatkv/placement.h"
#include "flatkv/store.h"
#include "model/model.h"
#include "service/remote_store.h"
#include "service/test_server.h"
#include "testing/smollm2_util.h"
#include "testing/test_util.h"

namespace flatkv::engine {
namespace {

using ::flatkv::testing::TempDir;

constexpr size_t kPromptTokens = 300;
constexpr uint32_t kBlockTokens = 32;
constexpr uint32_t kNewTokens = 8;
constexpr uint32_t kRestored = (kPromptTokens - 1) / kBlockTokens * kBlockTokens;  // 288

// The first kPromptTokens tokens of docs/architecture.md.
const std::vector<int>& Prompt(const model::Model& m) {
  static const std::vector<int>* prompt = [&m] {
    std::string text;
    const std::string path = std::string(FLATKV_SOURCE_DIR) + "/docs/architecture.md";
    auto* p = new std::vector<int>;
    if (!::flatkv::testing::ReadFile(path, &text)) {
      ADD_FAILURE() << "cannot read " << path;
      return p;
    }
    auto tokens = m.tokenizer->Encode(text, /*bos=*/false);
    if (!tokens.ok() || tokens->size() < kPromptTokens) {
      ADD_FAILURE() << path << ": " << (tokens.ok() ? std::to_string(tokens->size()) + " tokens" : tokens.status().ToString());
      return p;
    }
    p->assign(tokens->begin(), tokens->begin() + kPromptTokens);
    return p;
  }();
  return *prompt;
}

GenerateResult Request(const model::Model& m, Store* store, uint32_t chunk, SessionId session = 1) {
  EngineOptions eo;
  eo.block_tokens = kBlockTokens;
  eo.prefill_chunk = chunk;
  auto e = Engine::Create(m, store, eo);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  if (!e.ok()) return {};
  GenerateOptions go;
  go.max_new_tokens = kNewTokens;
  go.stop_at_eos = false;
  go.keep_logits = true;
  auto r = e->Generate(session, Prompt(m), go);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : GenerateResult{};
}

// The reference: no store, the whole prompt in one prefill chunk.
const GenerateResult& Cold(const model::Model& m) {
  static const GenerateResult* cold = new GenerateResult(Request(m, nullptr, kPromptTokens));
  return *cold;
}

void ExpectBitIdentical(const GenerateResult& want, const GenerateResult& got, const std::string& what) {
  ASSERT_EQ(want.tokens.size(), kNewTokens) << what;
  ASSERT_EQ(got.tokens, want.tokens) << what;
  ASSERT_EQ(got.logits.size(), want.logits.size()) << what;
  for (size_t i = 0; i < want.logits.size(); ++i) {
    ASSERT_EQ(got.logits[i].size(), want.logits[i].size()) << what;
    ASSERT_EQ(0, std::memcmp(got.logits[i].data(), want.logits[i].data(), want.logits[i].size() * sizeof(float)))
        << what << ": the logits of step " << i << " differ";
  }
}

TEST(EngineSmolLm2Test, EmbeddedColdDramWarmAndSsdWarmAreBitIdentical) {
  FLATKV_REQUIRE_SMOLLM2(model);
  const GenerateResult& cold = Cold(*model);
  ASSERT_EQ(cold.computed_prompt_tokens, kPromptTokens);
  for (Medium medium : {Medium::kDram, Medium::kSsd}) {
    const std::string name(MediumName(medium));
    TempDir dir;
    auto store = testing::StoreFor(*model, kBlockTokens, medium, dir.Sub("ssd"));
    ASSERT_NE(store, nullptr);
    // The first request computes (in chunks of 64) and stores; the second restores 9 blocks and prefills 12 tokens.
    const GenerateResult first = Request(*model, store.get(), 64);
    EXPECT_EQ(first.restored_tokens_dram + first.restored_tokens_ssd, 0u) << name;
    EXPECT_GE(first.stored_blocks, kRestored / kBlockTokens) << name;
    ExpectBitIdentical(cold, first, name + " first run");
    const GenerateResult warm = Request(*model, store.get(), medium == Medium::kDram ? 7 : 1);
    EXPECT_EQ(medium == Medium::kDram ? warm.restored_tokens_dram : warm.restored_tokens_ssd, kRestored) << name;
    EXPECT_EQ(warm.computed_prompt_tokens, kPromptTokens - kRestored) << name;
    ExpectBitIdentical(cold, warm, name + "-warm run");
  }
}

// The daemon with one tier: DRAM only, or SSD only (O_DIRECT), so a warm
// request restores from that medium.
std::unique_ptr<service::Server> Daemon(const model::Model& m, Medium medium, const TempDir& dir) {
  service::ServerConfig c = service::testing::SmallServerConfig(dir.path());
  c.store = StoreOptions{};
  c.store.shape = Engine::ShapeFor(m.config);
  c.store.block_tokens = kBlockTokens;
  c.store.use_direct_io = true;
  c.dram_bytes = medium == Medium::kDram ? 128ull << 20 : 0;
  if (medium == Medium::kSsd) {
    c.store.ssd_dirs = {dir.Sub("ssd")};
    c.store.segment_bytes = 64ull << 20;
    c.ssd_bytes = 256ull << 20;
  }
  return service::testing::StartServer(c);
}

TEST(EngineSmolLm2Test, ThroughTheDaemonColdDramWarmAndSsdWarmAreBitIdentical) {
  FLATKV_REQUIRE_SMOLLM2(model);
  const GenerateResult& cold = Cold(*model);
  for (Medium medium : {Medium::kDram, Medium::kSsd}) {
    const std::string name = "daemon " + std::string(MediumName(medium));
    TempDir dir;
    auto server = Daemon(*model, medium, dir);
    ASSERT_NE(server, nullptr) << name;
    auto client = service::testing::ConnectOrNull(server->unix_address(), service::testing::kTokenA);
    ASSERT_NE(client, nullptr) << name;
    service::RemoteStore remote(std::move(client));
    const GenerateResult first = Request(*model, &remote, 64, 1);
    EXPECT_EQ(first.restored_tokens_dram + first.restored_tokens_ssd, 0u) << name;
    ExpectBitIdentical(cold, first, name + " first run");
    // Another session with the same prompt restores its prefix from the daemon.
    const GenerateResult warm = Request(*model, &remote, 7, 2);
    EXPECT_EQ(warm.restored_tokens_dram + warm.restored_tokens_ssd, kRestored) << name;
    EXPECT_EQ(warm.computed_prompt_tokens, kPromptTokens - kRestored) << name;
    ExpectBitIdentical(cold, warm, name + "-warm run");
    auto stats = remote.client().StatsJson();
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    const auto j = nlohmann::json::parse(*stats);
    // The daemon held the blocks on this medium only, and the warm request's hits came from it.
    const char* used = medium == Medium::kDram ? "dram" : "ssd";
    const char* other = medium == Medium::kDram ? "ssd" : "dram";
    EXPECT_GE(j["store"][used]["hit_blocks"].get<uint64_t>(), kRestored / kBlockTokens) << *stats;
    EXPECT_EQ(j["store"][other]["blocks"].get<uint64_t>(), 0u) << *stats;
  }
}

TEST(EngineSmolLm2Test, ChunkedPrefillMatchesAWholePrefill) {
  FLATKV_REQUIRE_SMOLLM2(model);
  const GenerateResult& whole = Cold(*model);
  for (uint32_t chunk : {1u, 7u, 64u, 512u}) {
    const GenerateResult r = Request(*model, nullptr, chunk);
    ExpectBitIdentical(whole, r, "prefill chunk " + std::to_string(chunk));
  }
}

}  // namespace
}  // namespace flatkv::engine
