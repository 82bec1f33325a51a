// `flatkv generate`, `flatkv perplexity` and `flatkv dump-kv`: the
// reference engine from the command line.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace flatkv::tools {

struct ModelArgs {
  std::string model;      // llama2.c .bin or .gguf
  std::string tokenizer;  // llama2.c tokenizer file; not needed for .gguf
  uint32_t max_context = 0;  // 0 = the checkpoint's seq_len
};

struct GenerateArgs {
  ModelArgs m;
  std::string prompt;
  bool chat = false;      // render the prompt through the model's chat template
  std::string store_dir;  // empty: no store, no reuse
  uint64_t session = 1;
  bool json = false;
  uint32_t max_tokens = 64;
  float temperature = 0.0f;
  float top_p = 0.9f;
  uint64_t seed = 0;
  uint32_t block_tokens = 64;
  uint32_t prefill_chunk = 64;
  uint64_t dram_mib = 0;   // a DRAM tier only lives as long as the process
  uint64_t ssd_mib = 1024;
};

struct PerplexityArgs {
  ModelArgs m;
  std::string text_file;
  bool json = false;
};

struct DumpKvArgs {
  ModelArgs m;
  std::string text_file;
  std::string out;
  uint32_t max_tokens = 0;  // 0 = max_context
};

CLI::App* AddGenerateCommand(CLI::App& app, GenerateArgs& args);
CLI::App* AddPerplexityCommand(CLI::App& app, PerplexityArgs& args);
CLI::App* AddDumpKvCommand(CLI::App& app, DumpKvArgs& args);
int RunGenerate(const GenerateArgs& args);
int RunPerplexity(const PerplexityArgs& args);
int RunDumpKv(const DumpKvArgs& args);

}  // namespace flatkv::tools
