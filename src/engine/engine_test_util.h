// What the tests that run the reference engine share: the bundled
// stories260K model, a store of its shape, and the requests the daemon
// tests make (a prompt of a fixed pattern, 16-token blocks, and 6 greedy
// tokens with their logits kept, with the cold run, no store, to compare).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "engine/engine.h"
#include "flatkv/store.h"
#include "testing/test_util.h"

namespace flatkv::engine::testing {

// The bundled stories260K.bin and tok512.bin (data/models), loaded once;
// null when they cannot be loaded.
inline const model::Model* Stories() {
  static const auto* model = [] {
    const std::string dir = ::flatkv::testing::ModelDataDir();
    auto m = model::LoadLlama2c(dir + "/stories260K.bin", dir + "/tok512.bin");
    return m.ok() ? new model::Model(std::move(m).value()) : nullptr;
  }();
  return model;
}

// Declares `model` (Stories()) in a test. The model is bundled, so its
// absence is a failure, not a skip.
#define REQUIRE_MODEL()                                         \
  const ::flatkv::model::Model* model = ::flatkv::engine::testing::Stories(); \
  if (model == nullptr) FAIL() << "bundled stories260K not loadable from " << ::flatkv::testing::ModelDataDir()

// 3 + (i * mul + salt * 101 + i * i) % 509 for i = 0..n-1; with `bos`, the
// first token is BOS (1) instead.
inline std::vector<int> PatternTokens(size_t n, int mul, int salt = 0, bool bos = true) {
  std::vector<int> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = 3 + static_cast<int>((i * mul + salt * 101 + i * i) % 509);
  if (bos && n > 0) p[0] = 1;
  return p;
}

// BOS, then 3 + (i * mul + i * i) % 509.
inline std::vector<int> PatternPrompt(size_t n, int mul) { return PatternTokens(n, mul); }

// A store of `m`'s shape with every block on `medium`: 64 MiB of DRAM, or
// 256 MiB of SSD in `ssd_dir`. Fails the test (EXPECT) and returns null
// when it cannot be opened.
inline std::unique_ptr<Store> StoreFor(const model::Model& m, uint32_t block_tokens, Medium medium,
                                       const std::string& ssd_dir = "") {
  StoreOptions o;
  o.shape = Engine::ShapeFor(m.config);
  o.block_tokens = block_tokens;
  o.placement = std::make_shared<FixedPlacement>(medium);
  o.dram_capacity_bytes = medium == Medium::kDram ? 64ull << 20 : 0;
  if (medium == Medium::kSsd) {
    o.ssd_dirs = {ssd_dir};
    o.ssd_capacity_bytes = 256ull << 20;
    o.segment_bytes = 64ull << 20;
  }
  return ::flatkv::testing::OpenStore(o);
}

inline EngineOptions SixteenTokenBlocks() {
  EngineOptions eo;
  eo.block_tokens = 16;
  return eo;
}

inline GenerateOptions SixTokensWithLogits() {
  GenerateOptions go;
  go.max_new_tokens = 6;
  go.keep_logits = true;
  return go;
}

// The same request without a store.
inline Result<GenerateResult> ColdRun(const model::Model& m, const std::vector<int>& prompt) {
  auto e = Engine::Create(m, nullptr, SixteenTokenBlocks());
  if (!e.ok()) return e.status();
  return e->Generate(1, prompt, SixTokensWithLogits());
}

}  // namespace flatkv::engine::testing
