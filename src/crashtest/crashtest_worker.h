// The crash harness's worker (`flatkv crashtest --worker`, started by the
// driver in its own process and killed by it): K threads run random
// operations against a store directory or a daemon until SIGKILL, or until
// SIGTERM, on which the worker stops its threads, closes the store cleanly
// and exits 0.
//
// Operations: sessions that start from a shared system prompt or fork from
// another session's prefix and grow turn by turn (puts of chained blocks),
// restores that verify every byte, DropSession (store only), and an
// occasional clean Close and reopen (store only). Every acknowledged put,
// every reuse and every wrong block seen is logged after the fact, every
// drop before it is issued (crashtest_state.h).
#pragma once

#include <cstdint>
#include <string>

#include "flatkv/options.h"

namespace flatkv::tools::crashtest {

struct WorkerOptions {
  std::string dir;              // the run's directory: dir/store, dir/expected.log
  std::string connect;          // "unix:PATH" for the daemon; empty: open dir/store in process
  uint32_t incarnation = 0;     // the kill round: names this worker's sessions
  uint64_t seed = 1;
  uint32_t writers = 4;         // threads
  uint64_t dram_bytes = 0;      // store only
  uint64_t ssd_bytes = 0;       // store only
  SsdAdmission admission = SsdAdmission::kAll;
  uint32_t session_budget = 16; // sessions this worker may create
  bool drops = true;            // issue DropSession (store only)
  bool reopen = true;           // clean Close + reopen now and then (store only)
};

// Runs until killed or SIGTERM. Writes "ready\n" to stdout once the store
// is open and the threads are started (with `connect`, each thread then
// connects on its own; the driver starts a worker only once the daemon
// answers). Returns an exit code.
int RunWorker(const WorkerOptions& options);

}  // namespace flatkv::tools::crashtest
