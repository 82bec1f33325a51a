// `flatkv bench chain-cache`: SparseEngine's cross-request state on a
// multi-turn agent workload from real text (docs/attention.md, "Chain
// Cache" and "Pruned views"; figures in docs/benchmarks.md): Chain Cache
// against recompressing every turn and against full reuse (score
// evaluations, TTFT, bytes stored, next-turn perplexity), and prefix-cache
// pruning of the stale tool outputs (bytes pruned, next-turn perplexity,
// lookups of the pruned view by the logical prefix).
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace flatkv::tools {

struct BenchChainArgs {
  std::string model = "build/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  std::string sources = "/usr/lib/python3.11";  // tool outputs: the starts of these Python files
  std::string dir;               // the store's SSD directory (default: a fresh one under /tmp, removed after)
  uint32_t turns = 10;           // agent turns (one tool output each)
  uint32_t tool_tokens = 320;    // tokens of each tool output
  uint32_t quote_tokens = 48;    // tokens of the previous tool output the assistant quotes each turn
  uint32_t keep = 256;           // entries each KV head keeps after compaction (both compacting arms)
  uint32_t window = 32;          // the scorer's observation window (queries)
  std::string scorer = "snapkv"; // snapkv | streaming
  double prune_target = 0.5;     // fraction of the history's tokens the prune set removes (stale tool outputs)
  uint32_t block_tokens = 64;
  int threads = 0;               // the transformer's threads (0: the machine's)
  bool json = false;
};

CLI::App* AddBenchChainCommand(CLI::App& bench, BenchChainArgs& args);
int RunBenchChain(const BenchChainArgs& args);

}  // namespace flatkv::tools
