// `flatkv bench blend`: chunk reuse at any position (CacheBlend, docs/blend.md):
// quality and time to first token of naive reuse and selective recompute
// against a full prefill.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace flatkv::tools {

struct BenchBlendArgs {
  std::string model;  // default: the bundled stories260K
  std::string tokenizer;
  uint32_t block_tokens = 16;
  uint32_t check_layer = 1;
  float first_factor = 1.5f;  // BlendOptions::first_factor
  uint32_t reps = 5;  // TTFT repetitions (median reported)
  std::string workload = "story";  // greedy | story (bench_blend.cc)
  bool json = false;
};

CLI::App* AddBenchBlendCommand(CLI::App& bench, BenchBlendArgs& args);
int RunBenchBlend(const BenchBlendArgs& args);

}  // namespace flatkv::tools
