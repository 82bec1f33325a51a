// Requests the daemon tests run through the reference engine (stories260K):
// a prompt of a fixed pattern, 16-token blocks, and 6 greedy tokens with
// their logits kept, with the cold run (no store) to compare against.
#pragma once

#include <vector>

#include "engine/engine.h"

namespace flatkv::engine::testing {

// BOS, then 3 + (i * mul + i * i) % 509.
inline std::vector<int> PatternPrompt(size_t n, int mul) {
  std::vector<int> p(n);
  p[0] = 1;
  for (size_t i = 1; i < n; ++i) p[i] = 3 + static_cast<int>((i * mul + i * i) % 509);
  return p;
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
