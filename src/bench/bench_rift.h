// `flatkv bench rift`: self-speculative decoding on SmolLM2 with a
// selection-compressed drafter (engine/speculative.h): selection at prefill
// only against RIFT's refresh every N tokens and adaptive refresh, against
// target-only greedy decoding.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace flatkv::tools {

struct BenchRiftArgs {
  std::string model = "smollm2-135m";
  std::vector<std::string> text_files = {"/usr/lib/python3.11/pydoc_data/topics.py",
                                         "/usr/lib/python3.11/email/_header_value_parser.py",
                                         "/usr/lib/python3.11/datetime.py"};
  uint32_t prompt_tokens = 4096;
  uint32_t new_tokens = 2048;
  uint32_t gamma = 4;
  double budget_fraction = 0.25;
  uint32_t window = 64;
  uint32_t refresh_every = 64;
  std::vector<std::string> modes = {"prefill", "every", "adaptive"};
  int threads = 2;
  bool json = false;
};

CLI::App* AddBenchRiftCommand(CLI::App& bench, BenchRiftArgs& args);
int RunBenchRift(const BenchRiftArgs& args);

}  // namespace flatkv::tools
