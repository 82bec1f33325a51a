// `flatkv bench blend`: chunk reuse at any position (CacheBlend, docs/blend.md):
// quality and time to first token of naive reuse and selective recompute
// against a full prefill. With --model a GGUF (or smollm2-135m): the real
// model over the real-text workload's multi-document prompts, by the
// end-to-end protocol (bench_blend_model.cc, docs/eval.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
  // --model GGUF only (bench_blend_model.cc):
  std::vector<std::string> ids;   // multidoc prompt ids (empty: all that fit)
  uint32_t max_context = 8192;    // prompts with at most this context
  std::string workload_list;      // another realtext.tsv (tests)
};

CLI::App* AddBenchBlendCommand(CLI::App& bench, BenchBlendArgs& args);
int RunBenchBlend(const BenchBlendArgs& args);
int RunBenchBlendModel(const BenchBlendArgs& args, const std::string& model_path);

}  // namespace flatkv::tools
