// CachePolicy: one KV cache design, replayed against a trace at given DRAM
// and SSD capacities. The simulator (replay/simulator.h) asks each policy,
// per request, which leading blocks of the prompt hit and what reading them
// costs, and after prefill tells it to store the blocks that missed.
//
// Policies: "flat" (flatkv's own Store, placement at creation, never
// migrated), "flat-hints" (the same store driven as an agent-aware engine
// would drive it: Retain after each turn, Prefetch on arrival), "tiered" (after Mooncake Store's SSD offload), "files" (after
// LMCache's local-disk backend), and the bounds "infinite" and "belady".
// docs/baselines.md ties every baseline parameter to the design it follows.
//
// Thread-safety: a policy is driven by one simulator thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "flatkv/status.h"
#include "replay/trace.h"

namespace flatkv::replay {

struct IoModel;  // replay/io_model.h

enum class IoMode {
  kModel,  // costs come from bandwidth/latency figures (IoModel)
  kReal,   // the policy performs its reads and writes on real files; measured times are returned
};

struct PolicyConfig {
  uint64_t block_bytes = 0;       // KV bytes of one trace block (model bytes/token x trace block_tokens)
  uint32_t block_tokens = 0;
  uint64_t dram_bytes = 0;        // DRAM capacity (host memory for KV, staging included)
  uint64_t ssd_bytes = 0;         // SSD capacity
  const Trace* trace = nullptr;   // the whole trace (belady's future knowledge)
  IoMode io = IoMode::kModel;
  std::string dir;                // scratch directory for kReal
  double scale = 1.0;             // kReal: every byte size (block, capacities) divided by this
  uint32_t instances = 1;         // serving instances on the node; a policy that keeps per-instance
                                  // state (a client, a staging buffer, a hot cache) keeps this many
  const IoModel* io_model = nullptr;  // the run's I/O figures (nullptr: IoModel's defaults); must
                                      // outlive the policy
};

struct LookupResult {
  uint32_t hit_blocks = 0;        // leading blocks of the prompt that hit (usable prefix)
  uint32_t dram_blocks = 0;       // of those, served from DRAM
  uint32_t ssd_blocks = 0;        // of those, served from SSD
  uint32_t aborted_blocks = 0;    // found on SSD but not read (e.g. no staging space): counted as misses
  uint64_t dram_bytes_read = 0;   // bytes read from DRAM to restore them
  uint64_t ssd_bytes_read = 0;    // bytes read from SSD, amplification included
  uint64_t ssd_bytes_useful = 0;  // payload bytes the SSD reads delivered
  uint32_t dram_requests = 0;     // separate transfers, for latency modelling
  uint32_t ssd_requests = 0;
  double real_restore_s = -1;     // kReal: measured restore time; -1 in kModel
};

struct InsertResult {
  uint64_t dram_bytes_written = 0;
  uint64_t ssd_bytes_written = 0;
  uint32_t ssd_requests = 0;
  double real_write_s = -1;
};

// What a policy moved when a request arrived (Arrive), before its lookup.
struct ArriveResult {
  uint64_t ssd_bytes_read = 0;      // read from SSD (a prefetch), amplification included
  uint64_t dram_bytes_written = 0;  // copied into DRAM
  uint32_t ssd_requests = 0;
};

struct PolicyStats {
  uint64_t dram_used_bytes = 0, ssd_used_bytes = 0;
  uint64_t evicted_blocks = 0;    // dropped from the cache entirely
  uint64_t migrated_blocks = 0;   // moved between media (tiered: demotions and promotions)
};

class CachePolicy {
 public:
  virtual ~CachePolicy() = default;
  virtual std::string_view name() const = 0;
  // `req` is admitted for prefill on serving instance `instance` (< config
  // instances) at simulated time now_s.
  virtual LookupResult Lookup(const Request& req, uint32_t instance, double now_s) = 0;
  // After prefill at now_s on `instance`: every block of `req` is computed;
  // store those from `hit_blocks` on (the policy decides where, and what to
  // evict).
  virtual InsertResult Insert(const Request& req, uint32_t instance, uint32_t hit_blocks, double now_s) = 0;
  // `req` arrived for `instance` at now_s, behind `waiting_ahead` requests
  // that wait for admission there (what the engine's scheduler knows). A
  // policy that acts on arrival (a prefetch into DRAM) returns what it
  // moved: the simulator charges it to the node's SSD and host memory as a
  // background transfer, and a request admitted while its prefetch still
  // runs starts its restore when the prefetch ends. Default: nothing.
  virtual ArriveResult Arrive(const Request& /*req*/, uint32_t /*instance*/, double /*now_s*/,
                              uint32_t /*waiting_ahead*/) {
    return {};
  }
  virtual PolicyStats Stats() const = 0;
  // True when a restore streams layer by layer, so the request's prefill
  // can start once the first layer has arrived (flat: Restore's per-layer
  // readiness). False: the whole restore lands before prefill starts.
  virtual bool layerwise() const { return false; }
  // True when a restore's SSD reads are issued one at a time by each of the
  // instance's tp workers (files: LMCache's get_blocking reads chunk after
  // chunk in the caller), so every read pays the drive's latency; false:
  // reads are queued together and the restore pays one latency.
  virtual bool serial_ssd_reads() const { return false; }
};

// The names MakePolicy knows ("flat", "flat-hints", "tiered", "files",
// "infinite", "belady"), and the same as one comma-separated list for
// messages. A replay's default runs all but flat-hints.
const std::vector<std::string>& PolicyNames();
std::string PolicyNameList();
// Makes a policy by name (PolicyNames()); InvalidArgument names the unknown
// policy and lists the known ones.
Result<std::unique_ptr<CachePolicy>> MakePolicy(std::string_view name, const PolicyConfig& config);

}  // namespace flatkv::replay
