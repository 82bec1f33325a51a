// `flatkv bench codecs`: every codec setting on real KV (stories260K
// through the reference engine, or a `flatkv dump-kv` file) and on
// synthetic Llama-3.1-8B-shaped KV: size, error, attention error, the
// end-to-end next-token KL and perplexity change, and single-core encode
// and decode speed next to memcpy and zstd -1 measured in the same run.
// docs/benchmarks.md has the figures; docs/format_codec.md the codecs.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace flatkv::tools {

struct BenchCodecsArgs {
  std::string kv;     // a dump-kv file instead of running stories260K in-process
  std::string model;  // default: stories260K from the shared data
  std::string tokenizer;
  std::string dtype = "bf16";  // what the codecs see
  bool json = false;
  bool quick = false;  // smaller inputs and shorter timings (CI)
};

CLI::App* AddBenchCodecsCommand(CLI::App& bench, BenchCodecsArgs& args);
int RunBenchCodecs(const BenchCodecsArgs& args);

}  // namespace flatkv::tools
