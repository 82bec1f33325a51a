// `flatkv bench serve`: the daemon's restore throughput and its lookup and
// restore latencies, next to the in-process store in the same run.
// Workloads are listed in bench_serve.cc.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace flatkv::tools {

struct BenchServeArgs {
  uint32_t clients = 64;       // concurrent lookup clients (each its own connection and thread)
  bool json = false;           // print JSON instead of the table
  bool quick = false;          // smaller chain, fewer reps, shorter lookup phase
  uint32_t blocks = 0;         // chain length in blocks; 0: 16 (quick: 8)
  uint32_t reps = 0;           // restores per path; 0: 10 (quick: 4)
  double lookup_seconds = 0;   // per transport; 0: 2 (quick: 0.5)
  uint32_t lookup_keys = 16;   // keys per lookup
  double lookup_interval_us = 5000;  // paced phase: each client once per this long
  uint32_t redis_rounds = 0;   // interleaved 1-key lookup / Redis GET rounds; 0: 3 (quick: 1)
  bool no_redis = false;       // skip the Redis GET baseline
  bool no_peers = false;       // skip Mooncake Store's gets (bench_peers.h)
  std::string shape = "llama-3.1-8b";
  std::string dir;             // parent of the scratch directory; empty: /var/tmp
};

CLI::App* AddBenchServeCommand(CLI::App& bench, BenchServeArgs& args);
int RunBenchServe(const BenchServeArgs& args);

}  // namespace flatkv::tools
