// `flatkv bench engine`: the reference engine's prefill and decode speed,
// and time to first token cold, warm from DRAM and warm from SSD, with
// llama.cpp measured beside it on a GGUF model.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace flatkv::tools {

struct BenchEngineArgs {
  std::string model;       // a path, or "smollm2-135m"; default: stories260K from the bundled data
  std::string tokenizer;
  std::string dir;         // parent of the scratch directory holding the SSD stores (default: /var/tmp)
  uint32_t prompt_tokens = 0;  // 0: 1024, 2048, 4096 and 7936 for a GGUF model, 4096 otherwise
  uint32_t block_tokens = 64;
  uint32_t prefill_chunk = 256;
  uint32_t decode_tokens = 64;
  uint32_t reps = 5;       // warm runs and raw reads per prompt length (medians reported)
  uint32_t cold_reps = 1;  // no-store cold runs per prompt length, beside the two that fill the stores
  bool json = false;
  // llama.cpp (GGUF models only): bench/llamacpp_bench.py under this interpreter.
  bool no_llamacpp = false;
  std::string python;            // default: <source dir>/build/pyenv/refs/bin/python
  uint32_t threads = 0;  // the engine's and llama.cpp's (compared on equal threads); 0 = the machine's cores
  uint32_t llamacpp_reps = 3;
};

CLI::App* AddBenchEngineCommand(CLI::App& bench, BenchEngineArgs& args);
int RunBenchEngine(const BenchEngineArgs& args);

}  // namespace flatkv::tools
