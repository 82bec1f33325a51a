// `flatkv stats`: opens an existing store's SSD directories with
// StoreOptions::read_only (nothing on disk changes), prints its StoreStats,
// and closes it. With --server ADDR it asks a running `flatkv serve`
// daemon instead and prints its store, server and per-tenant counters.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace flatkv::tools {

struct StatsArgs {
  std::vector<std::string> ssd_dirs;  // one or more store directories
  bool json = false;                  // StoreStats::ToJson() instead of ToString()
  std::string server;                 // a daemon's address (unix:PATH or tcp:HOST:PORT)
  std::string token;                  // its tenant token (default: $FLATKV_TOKEN)
};

// Adds `stats` to `app`, parsing into `args`.
CLI::App* AddStatsCommand(CLI::App& app, StatsArgs& args);

// Returns a process exit code (tools/tool_common.h).
int RunStats(const StatsArgs& args);

}  // namespace flatkv::tools
