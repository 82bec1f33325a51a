// `flatkv bench codecs`: every codec setting on real KV (stories260K
// through the reference engine, or a `flatkv dump-kv` file) and on
// synthetic Llama-3.1-8B-shaped KV: size, error, attention error, the
// end-to-end next-token KL and perplexity change, and single-core encode
// and decode speed next to memcpy and zstd -1 measured in the same run.
// With --model a GGUF (or smollm2-135m): the real model's KV over the
// real-text workload by the end-to-end protocol (bench_codecs_model.cc,
// docs/eval.md), with transformers' QuantizedCache and zstd -1 as peers.
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
  // --model GGUF only (bench_codecs_model.cc):
  std::vector<std::string> kinds;  // workload kinds (empty: all)
  std::vector<std::string> ids;    // workload prompt ids (empty: all that fit)
  uint32_t max_context = 2048;     // prompts with at most this context
  std::string workload_list;       // another realtext.tsv (tests)
  std::vector<std::string> peers = {"quanto:int4", "quanto:int2", "zstd-1:bf16"};
  std::string peer_python;         // default: build/pyenv/kvpeers/bin/python
  std::string hf_model_dir;        // default: build/models/smollm2-135m-hf
  bool no_store = false;           // skip the rows through the store
};

// The GGUF path of `bench codecs --model` (bench_codecs_model.cc).
int RunBenchCodecsModel(const BenchCodecsArgs& args, const std::string& model_path);

CLI::App* AddBenchCodecsCommand(CLI::App& bench, BenchCodecsArgs& args);
int RunBenchCodecs(const BenchCodecsArgs& args);

}  // namespace flatkv::tools
