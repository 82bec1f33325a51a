// `flatkv bench remote`: layer-wise prefix restores from a Redis Cluster
// through the remote tier, against the same bytes as plain pipelined GETs
// (the ceiling) and against LMCache's layout (one value per 256-token chunk
// of all layers, plus a metadata key), in one run; and a master kill during
// restores. Workloads are listed in bench_remote.cc.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace flatkv::tools {

struct BenchRemoteArgs {
  std::string cluster;           // seeds "host:port,..."; empty: start a local cluster
  bool json = false;
  bool quick = false;
  uint32_t blocks = 0;           // prefix length in 64-token blocks; 0: 16 (quick: 4)
  uint32_t reps = 0;             // per layout, interleaved; 0: 5 (quick: 2)
  uint32_t chunk_tokens = 256;   // LMCache's chunk_size default
  uint64_t object_mib = 4;       // the remote tier's object size
  uint32_t inflight = 32;        // objects (or chunks) requested at once
  bool no_failover = false;      // skip the master kill
  std::string shape = "llama-3.1-8b";
  std::string dir;               // parent of the local cluster's directory; empty: /var/tmp
};

CLI::App* AddBenchRemoteCommand(CLI::App& bench, BenchRemoteArgs& args);
int RunBenchRemote(const BenchRemoteArgs& args);

}  // namespace flatkv::tools
