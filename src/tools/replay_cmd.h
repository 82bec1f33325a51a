// `flatkv replay`: replays real traces through every cache policy at every
// load factor, on the serving model of replay/simulator.h, and prints the
// comparison (a table, or JSON with --json) and optional SVG plots.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace flatkv::tools {

struct ReplayArgs {
  std::vector<std::string> traces;        // files or directories
  std::string workload;                   // --workload spec instead of traces (replay/workload_multiturn.h)
  std::string policies = "flat,tiered,files,infinite,belady";
  std::string dram = "64GiB";             // DRAM capacity, true (unscaled) bytes
  std::string ssd = "2TiB";               // SSD capacity
  std::string model = "llama-3.1-70b";
  std::string loads = "0.5,1,2,4";
  std::string io = "model";               // model | real
  bool json = false;
  std::string plot_dir;
  uint32_t instances = 8;
  double gpu_tflops = 400;
  double hbm_tbps = 3.35;
  double decode_batch = 32;
  double pcie_gbps = 25;
  double dram_gbps = 11;
  double ssd_gbps = 2.0;
  double ssd_latency_us = 60;
  double ssd_parallel = 4;
  bool calibrate = false;
  double scale = 64;                      // --io real: sizes divided by this
  double stagger_s = 60;
  uint64_t conversations = 0;             // 0: all
  uint64_t max_requests = 0;              // 0: all
  std::string dir;                        // scratch parent directory (default /var/tmp)
};

// Adds `replay` to `app`, parsing into `args`.
CLI::App* AddReplayCommand(CLI::App& app, ReplayArgs& args);

// Returns a process exit code (tools/tool_common.h).
int RunReplay(const ReplayArgs& args);

// "8GiB", "512MiB", "1.5TB", "4096" -> bytes; the error names the text.
bool ParseSize(const std::string& text, uint64_t* bytes, std::string* error);

}  // namespace flatkv::tools
