// `flatkv bench attention`: budgeted KV selection and sparse decode attention.
//   quality  every selector (scorer x allocator) at several budgets on
//            stories260K over a text: retained attention mass and attention
//            output error (continuation queries of the dense run over the
//            kept prompt keys), next-token KL and perplexity change when
//            the engine decodes the continuation from the compacted KV
//            (teacher forcing).
// With --model a GGUF (or smollm2-135m): the selectors, Quest and the
// certified sampler on the real model over the real-text workload by the
// end-to-end protocol, with NVIDIA kvpress's presses as peers
// (bench_attention_model.cc, docs/attention.md).
//   decode   one layer's decode step on synthetic Llama-3.1-8B-shaped f16
//            caches (32 query heads, 8 KV heads, head_dim 128) at 32K, 64K
//            and 128K tokens: dense (1 and 2 threads, bandwidth vs memcpy),
//            Quest at a 4K-token budget, the certified sampler at eps 0.05.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "attention/scoring.h"
#include "flatkv/status.h"
#include "model/model.h"

namespace flatkv::tools {

struct BenchAttentionArgs {
  std::string model;      // default: stories260K from the shared data
  std::string tokenizer;
  bool json = false;
  bool quick = false;     // small shapes, one budget: well under a minute (CLI smoke test)
  int threads = 2;        // the multi-threaded decode runs
  uint32_t reps = 5;      // timed repetitions per decode case (median)
  float dispersed_scale = 0.8f;  // synthetic caches: the most dispersed head's special-logit factor (1 = all concentrated)
  // --model GGUF only (bench_attention_model.cc): the real-text workload.
  std::vector<std::string> ids = {  // issue 32's scope: 8 prompts at 2K, 4 at the longest context (7,936)
      "code-2k-argparse", "code-2k-difflib", "prose-2k-a", "prose-2k-b", "multi-2k-sqlite3", "multi-2k-tomllib",
      "passkey-2k-d30", "passkey-2k-d70", "code-8k-pydecimal", "prose-8k-a", "multi-8k-zoneinfo", "passkey-8k-d50"};
  uint32_t max_context = 0;            // > 0: only prompts with at most this context
  std::string workload_list;           // another realtext.tsv (tests: data/workload/ci.tsv)
  std::vector<double> kept_fractions = {0.5, 0.25};  // budgets: fraction of the context's KV kept
  std::vector<std::string> peers = {"kvpress"};
  std::vector<std::string> presses;    // kvpress presses (empty: bench/kvpress_peer.py's list)
  std::string peer_python;             // default: build/pyenv/kvpeers/bin/python
  std::string hf_model_dir;            // default: build/models/smollm2-135m-hf
  uint32_t h2o_max_context = 2048;     // H2O scores with every prompt query, O(C^2): longer prompts skip it
  uint32_t sparse_min_context = 0;     // Quest and the sampler on prompts this long (0: the longest)
  bool no_sparse = false;
  std::vector<std::string> selectors;  // scorer+allocator names to run (empty: all; "none": no selection)
};

CLI::App* AddBenchAttentionCommand(CLI::App& bench, BenchAttentionArgs& args);
// The GGUF path of `bench attention --model` (bench_attention_model.cc).
int RunBenchAttentionModel(const BenchAttentionArgs& args, const std::string& model_path);
int RunBenchAttention(const BenchAttentionArgs& args);

// One selector at one budget (bench_attention_quality.cc).
struct SelectorRow {
  std::string name;          // scorer+allocator
  double budget = 0;         // fraction of prompt tokens removed (kvpress)
  double retained_mass = 0;  // mean over layers, heads, continuation queries
  double attn_err = 0;       // mean relative L2 error of attention outputs
  double kl = 0;             // mean next-token KL(dense || compacted), nats
  double ppl_dense = 0, ppl = 0;
};

struct QualitySetup {
  uint32_t prompt_tokens = 320;
  uint32_t continuation_tokens = 128;
  std::vector<double> budgets = {0.25, 0.5, 0.75, 0.9};
};

// NVIDIA kvpress 0.5.5's defaults (kvpress/presses/snapkv_press.py, pyramidkv_press.py,
// adakv_press.py), which the `snapkv_kvpress` selectors reproduce.
struct KvpressDefaults {
  static constexpr uint32_t kWindow = 64;       // SnapKVPress / PyramidKVPress window_size
  static constexpr uint32_t kKernel = 5;        // their kernel_size (average pooling)
  static constexpr double kAdaAlpha = 0.2;      // AdaKVPress alpha_safeguard
};

// The bench's scorers by name (streaming, h2o, snapkv, snapkv_kvpress, agentkv, rehearsal), at the settings
// docs/attention.md lists.
std::unique_ptr<attention::Scorer> MakeScorer(const std::string& name);

Result<std::vector<SelectorRow>> RunSelectorQuality(const model::Model& m, const QualitySetup& setup,
                                                    uint32_t* text_tokens);

}  // namespace flatkv::tools
