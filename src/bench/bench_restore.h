// `flatkv bench restore`: session restore throughput of flatkv against its
// ceilings (memcpy, raw O_DIRECT read) and its peers (file per block,
// RocksDB). Workloads are listed in bench_restore.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace flatkv::tools {

struct BenchRestoreArgs {
  bool quick = false;  // sizes 1,16,64,256 MiB and 3 reps: about a minute on 2 cores
  bool json = false;   // print JSON instead of the table
  std::string dir;     // parent of the scratch directory; empty: /var/tmp
  std::string shape = "llama-3.1-8b";
  std::vector<uint64_t> sizes_mib;  // empty: the mode's default
  uint32_t reps = 0;                // 0: the mode's default
  uint32_t block_tokens = 0;        // 0: 64, halved (down to 16) for sessions smaller than one block
  std::vector<std::string> runs;    // empty: all six
  bool no_peers = false;            // leave out the real peers (bench_peers.h) when --runs is not given
  bool drop_caches = false;         // also write /proc/sys/vm/drop_caches before page-cache reads (root)
  uint32_t raw_request_kib = 4096;  // raw_direct_read request size
  uint32_t raw_queue_depth = 8;     // raw_direct_read requests in flight
  uint32_t window_layers = 0;       // StoreOptions::window_layers for the store runs; 0: its default
  // Codec spec: adds ssd_codec_restore (the session stored with this codec)
  // and fills the session with synthetic KV (codec/synthetic_kv.h) instead
  // of random bytes, for every run.
  std::string codec;
  uint32_t decode_threads = 0;      // StoreOptions::decode_threads for the store runs; 0: its default
  // memcpy's threads and dram_restore's StoreOptions::dram_threads; 0: the CPUs online.
  uint32_t copy_threads = 0;
};

// Adds `restore` to `bench`, parsing into `args`.
CLI::App* AddBenchRestoreCommand(CLI::App& bench, BenchRestoreArgs& args);

// Runs the benchmark; returns a process exit code (tools/tool_common.h).
int RunBenchRestore(const BenchRestoreArgs& args);

}  // namespace flatkv::tools
