// `flatkv bench metadata`: the store's metadata at the scale of a node
// (issue 13 item 4): process memory per block stored, lookup latency as the
// index grows, recovery time after kill -9, and SSD space efficiency under
// small sessions. Workloads and measurements are listed in bench_metadata.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace flatkv::tools {

struct BenchMetadataArgs {
  bool quick = false;             // 20K 1-layer and 2K 80-layer blocks: seconds
  bool json = false;              // print JSON instead of the table
  std::string dir;                // parent of the scratch directory; empty: /var/tmp
  uint64_t blocks = 0;            // 1-layer runs; 0: 10M (quick 20K)
  uint64_t layers80_blocks = 0;   // 80-layer runs; 0: 250K (quick 2K)
  // Explicit runs instead of the default four: LAYERSxBLOCKS[:CODEC], CODEC
  // a codec spec or "none" (the uncoded layout); default codec raw.
  std::vector<std::string> runs;
  std::string trace;              // Mooncake conversation trace; empty: the shared data's
  uint32_t session_blocks = 8192;  // blocks per session while filling
  uint32_t put_blocks = 64;        // blocks per Put (one chain of keys)
  uint32_t lookups = 0;            // timed lookups per measuring point; 0: 200K (quick 20K)
};

// Adds `metadata` to `bench`, parsing into `args`.
CLI::App* AddBenchMetadataCommand(CLI::App& bench, BenchMetadataArgs& args);

// Runs the benchmark; returns a process exit code (tools/tool_common.h).
int RunBenchMetadata(const BenchMetadataArgs& args);

}  // namespace flatkv::tools
