// `flatkv workload`: the real-text workload set (eval/workload.h,
// docs/eval.md) built for a model, written as JSON (token ids, for peers
// that run elsewhere, such as transformers), and with --eval each prompt's
// exact-cache reference: the context-helps filter and retrieval answers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace flatkv::tools {

struct WorkloadArgs {
  std::string model = "smollm2-135m";
  std::string out;                  // JSON file; empty: a summary on stdout
  std::vector<std::string> kinds;   // long, multidoc, retrieval
  std::vector<std::string> ids;
  uint32_t max_context = 0;
  bool eval = false;                // run the exact-cache reference of every prompt
  bool json = false;
};

CLI::App* AddWorkloadCommand(CLI::App& app, WorkloadArgs& args);
int RunWorkload(const WorkloadArgs& args);

}  // namespace flatkv::tools
