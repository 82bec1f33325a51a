// `flatkv bench engine`: the reference engine's prefill and decode speed,
// and time to first token cold, warm from DRAM and warm from SSD.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace flatkv::tools {

struct BenchEngineArgs {
  std::string model;       // default: stories260K from the shared data
  std::string tokenizer;
  std::string dir;         // SSD store directory (default: a fresh one under /var/tmp)
  uint32_t prompt_tokens = 4096;
  uint32_t block_tokens = 64;
  uint32_t prefill_chunk = 256;
  uint32_t decode_tokens = 64;
  uint32_t reps = 5;
  bool json = false;
};

CLI::App* AddBenchEngineCommand(CLI::App& bench, BenchEngineArgs& args);
int RunBenchEngine(const BenchEngineArgs& args);

}  // namespace flatkv::tools
