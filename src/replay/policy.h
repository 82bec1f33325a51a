// CachePolicy: one KV cache design, replayed against a trace at given DRAM
// and SSD capacities. The simulator (replay/simulator.h) asks each policy,
// per request, which leading blocks of the prompt hit and what reading them
// costs, and after prefill tells it to store the blocks that missed.
//
// Policies: "flat" (flatkv's own Store: SSD homes, DRAM copies; its DRAM
// hits copied by the store's threads into a host window, then across the
// link, as built), "flat-gpu-window" (the same store with its DRAM hits
// DMA'd straight to the GPU: the GPU window, built in src/gpu/ but not
// yet measured on a GPU, so its DMA is charged at the link's rate),
// "flat-hints" (the store driven as an agent-aware engine would drive it:
// Retain after each turn, Prefetch on arrival), "tiered" (after Mooncake
// Store's SSD offload, promotion on hit), "files" (after LMCache's
// local-disk backend), the bounds "infinite" and "belady", and the
// baselines' best configurations: "tiered-lw" (HiCache over Mooncake: DRAM
// part by layer, SSD objects whole first), "tiered-nopromo" and
// "tiered-lw-nopromo" (Mooncake's default, no promotion on hit), "files-lw"
// (LMCache use_layerwise: per-layer objects) and "infinite-lw" (every hit
// in DRAM, streamed by layer at the link: the lower bound on TTFT).
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
  uint32_t layers = 0;            // the model's layers (files-lw splits a chunk into this many objects)
  uint32_t dram_copy_threads = 0; // flat: its DRAM copy threads as charged (0: StoreOptions::dram_threads); a what-if
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
  // readiness; the -lw baselines). False: the whole restore lands before
  // prefill starts.
  virtual bool layerwise() const { return false; }
  // With layerwise(): true when the SSD part streams by layer too (flat's
  // layer-major extents, LMCache's per-layer objects); false when SSD
  // objects hold every layer and are read whole into host memory before
  // their first layer can cross to the GPU (HiCache's L3 pages).
  virtual bool ssd_layerwise() const { return false; }
  // Threads that copy DRAM hits into a host window before they cross to
  // the GPU (flat: StoreOptions::dram_threads), each at the node's
  // memcpy_core_gbps; 0: DMA from pinned host memory at the link's rate.
  virtual uint32_t dram_copy_threads() const { return 0; }
  // The bound (infinite-lw): a step never waits for its layer-wise loads.
  // Their bytes still cross the node's links, so they slow every flow that
  // shares them, but their time hides under the step's compute entirely:
  // no engine does better. false: the step ends no earlier than a load's
  // last layer lands, as engines that load by layer inside the forward pass
  // do (vLLM's wait_for_layer_load, LMCache's retrieve_layer, HiCache).
  virtual bool hidden_loads() const { return false; }
  // True when a restore's SSD reads are issued one at a time by each of the
  // instance's tp workers (files: LMCache's get_blocking reads chunk after
  // chunk in the caller), so every read pays the drive's latency; false:
  // reads are queued together and the restore pays one latency.
  virtual bool serial_ssd_reads() const { return false; }
};

// The names MakePolicy knows (the list above), and the same as one
// comma-separated list for messages.
const std::vector<std::string>& PolicyNames();
std::string PolicyNameList();
// Makes a policy by name (PolicyNames()); InvalidArgument names the unknown
// policy and lists the known ones.
Result<std::unique_ptr<CachePolicy>> MakePolicy(std::string_view name, const PolicyConfig& config);

}  // namespace flatkv::replay
