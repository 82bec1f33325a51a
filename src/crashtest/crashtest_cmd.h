// `flatkv crashtest`: a crash harness in the manner of RocksDB's
// db_crashtest.py (docs/crashtest.md). It starts a worker process that runs
// random puts, restores, drops and clean reopens from several threads
// against a store directory (--target store) or a `flatkv serve` daemon
// (--target serve), kills it (or the daemon) with SIGKILL at random times,
// stops it with SIGTERM in every fourth round (the third, seventh, ...), restarts, and checks every
// acknowledged block byte for byte against the expected-state log.
// `--faults` instead runs a short in-process fault-injection pass (EIO,
// ENOSPC, short reads, torn and lost writes, corrupted reads).
//
// Exit codes: 0 every check passed; 1 a wrong block, a lost block the
// contract forbids losing, or a process that failed; 2 a bad argument.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "crashtest/crashtest_worker.h"

namespace flatkv::tools {

struct CrashtestArgs {
  std::string target = "store";      // store | serve
  std::string dir;                   // the run's directory (created; an earlier run there is continued)
  uint32_t kills = 5;                // rounds
  uint64_t seed = 1;
  uint32_t writers = 4;
  std::string dram = "64MiB";        // DRAM tier bytes; 0 disables it
  std::string ssd = "512MiB";        // SSD capacity
  std::string admission = "all";     // all | on-reuse
  bool shared_refcount = false;      // require blocks shared with live sessions after a drop
  uint32_t min_ms = 100, max_ms = 600;  // how long a worker runs before it is killed
  bool faults = false;
  bool json = false;
  // Hidden: run as the worker of a driver.
  bool worker = false;
  uint32_t incarnation = 0;
  uint32_t session_budget = 16;
  std::string connect;
  bool no_drops = false, no_reopen = false;
};

CLI::App* AddCrashtestCommand(CLI::App& app, CrashtestArgs& args);
int RunCrashtest(const CrashtestArgs& args);

// The fault-injection pass (crashtest_faults.cc).
int RunFaultPass(const std::string& dir, uint64_t seed, bool json);

}  // namespace flatkv::tools
