// `flatkv bench sparse-prefill`: RBS-Attention block-sparse prefill
// (attention/rbs.h) against dense attention, on SmolLM2's longest context of
// real text (perplexity, density, retention, attention time) and on the
// synthetic long-prompt attention bench at 32K-128K (sampled query blocks
// against dense attention for the same rows), with the rescue branch ablated.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace flatkv::tools {

struct BenchSparsePrefillArgs {
  std::string model = "smollm2-135m";
  std::string text_file = "/usr/lib/python3.11/pydoc_data/topics.py";
  uint32_t tokens = 0;  // real-text prompt length; 0 = the model's context (SmolLM2: 8192)
  uint32_t chunk = 512;  // prefill chunk (a multiple of block)
  uint32_t block = 64;
  std::vector<double> base_mass = {0.9};
  std::vector<std::string> modes = {"rbs", "base_only", "base_matched"};  // real part: which masks run
  double rescue_share = 0.05;
  uint32_t local_blocks = 1;
  std::vector<double> synthetic_base_mass = {0.9};
  std::vector<uint32_t> synthetic_tokens = {32768, 65536, 131072};
  uint32_t sample_blocks = 64;
  int heads = 4;
  int threads = 2;
  bool skip_real = false;
  bool skip_synthetic = false;
  bool json = false;
};

CLI::App* AddBenchSparsePrefillCommand(CLI::App& bench, BenchSparsePrefillArgs& args);
int RunBenchSparsePrefill(const BenchSparsePrefillArgs& args);

}  // namespace flatkv::tools
