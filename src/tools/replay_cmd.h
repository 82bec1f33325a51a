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
  std::string loads = "auto";             // "auto" (capacity search) or comma-separated factors
  std::string hw = "h100-node";           // node profile name
  std::string hw_file;                    // profiles file (default data/hw/profiles.toml of the source tree)
  uint32_t orders = 3;                    // conversation orders per point (the spread)
  uint32_t capacity_orders = 0;           // orders at 1x the capacity load (0: --orders)
  double capacity_load = 0;               // > 0: the capacity load, not searched (0.5x, 1x, 2x of it)
  uint32_t jobs = 1;                      // replays run at once (threads)
  std::string json_out;                   // also write the JSON here (the table still prints)
  std::string capacity_only;              // policies replayed only at 1x the capacity load (comma separated)
  uint32_t copy_threads = 0;              // flat's DRAM copy threads as charged (0: the store's dram_threads)
  uint32_t tp = 0;                        // tensor-parallel degree (0: the profile's or derived)
  bool calibrate_serving = false;         // recompute the published serving figure and exit
  std::string io = "model";               // model | real
  bool json = false;
  std::string plot_dir;
  bool calibrate = false;                 // measure the storage figures on this machine (profile vm)
  double scale = 64;                      // --io real: sizes divided by this
  double stagger_s = 60;
  uint64_t conversations = 0;             // 0: all
  uint64_t max_requests = 0;              // 0: all
  std::string dir;                        // scratch parent directory (default /var/tmp)
  uint32_t nodes = 1;                     // nodes of the profile, each with its own DRAM and SSD
  std::string routing = "affinity";       // affinity | round-robin
  std::string remote;                     // per node: cap on the shared tier ("" : --dram with --nodes > 1, else 0)
  std::string remote_buffer;              // per node: publish buffer ("": the store's rule, max(256 MiB, --dram / 16))
};

// Adds `replay` to `app`, parsing into `args`.
CLI::App* AddReplayCommand(CLI::App& app, ReplayArgs& args);

// Returns a process exit code (tools/tool_common.h).
int RunReplay(const ReplayArgs& args);

// "8GiB", "512MiB", "1.5TB", "4096" -> bytes; the error names the text.
bool ParseSize(const std::string& text, uint64_t* bytes, std::string* error);

}  // namespace flatkv::tools
