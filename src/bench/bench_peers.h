// The real storage peers of `flatkv bench restore` and `flatkv bench serve`,
// run here on the same bytes as flatkv (docs/baselines.md, "Mooncake Store"
// and "LMCache's backends"), and flatkv's own restore through the daemon's
// shared-memory path, the one that crosses a process boundary as they do:
//
//   daemon_shm_restore  a `flatkv serve` child process (this binary) holding
//                       the session in DRAM; a client over its Unix socket
//                       restores into a registered memfd window.
//   mooncake_dram       Mooncake Store standalone: mooncake_master and one
//                       mooncake_client (the real client owning the DRAM pool)
//                       on loopback; a DummyClient (no segment) reads with
//                       batch_get_into into its shared-memory pool.
//   mooncake_dram_tcp   the same store read by an embedded client with no
//                       segment (global_segment_size 0) over the TCP transfer
//                       engine: batch_get_into straight into the destination.
//   mooncake_ssd        a second store with SSD offload (bucket backend, offload
//                       on evict) whose pool is overfilled so every session
//                       block is on SSD only; DummyClient batch_get_into.
//   lmcache_cpu         LMCache's LocalCPUBackend, in-process, CPU tensors.
//   lmcache_disk        LMCache's LocalDiskBackend, in-process, CPU tensors.
//
// The peers are driven by scripts/peer_bench.py in a pinned Python
// environment (build/pyenv/peers for Mooncake, build/pyenv/vllm for LMCache),
// a child of this process speaking JSON lines; the session's bytes travel in
// a memfd both map, and every run's delivered bytes come back through it to
// be verified like flatkv's. A peer that cannot run is not fatal: its run is
// left out and its error (with the steps tried) goes to peer_errors; under
// CI=true the peers test fails on it.
//
// Thread-safety: runs are driven by one thread, like every RestoreRun.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "bench/bench_report.h"
#include "bench/bench_runs.h"

namespace flatkv::tools {

inline constexpr std::array<std::string_view, 6> kPeerRunNames = {
    "daemon_shm_restore", "mooncake_dram", "mooncake_dram_tcp", "mooncake_ssd", "lmcache_cpu", "lmcache_disk"};

// What the peers take beside flatkv's runs for a session of `padded` bytes:
// the memfd (2x), Mooncake's two pools and the DummyClients' shared memory,
// LMCache's CPU pool, the daemon's DRAM; on disk Mooncake's offload (the
// session and the filler that pushes it out of the pool) and LMCache's files.
struct PeerFootprint {
  uint64_t memory_bytes = 0, disk_bytes = 0;
};
PeerFootprint PeerFootprintOf(uint64_t padded);

// State the peer runs of one benchmark share: the memfd, the Mooncake
// drivers two runs read from, the errors.
struct PeerContext;
std::shared_ptr<PeerContext> MakePeerContext();

// One of kPeerRunNames.
std::unique_ptr<RestoreRun> MakePeerRun(std::string_view name, const std::shared_ptr<PeerContext>& ctx);

// Per-object gets of one `value_bytes` value (put first) through a peer run's
// driver after its Setup (Mooncake runs only), one client, closed loop:
// {"get_p50_us", "get_p99_us", "gets", ...} or {"error": ...}.
nlohmann::json PeerLatency(RestoreRun& run, uint32_t value_bytes, uint32_t count);

// bench restore's JSON: mooncake_dram_gbps, mooncake_dram_tcp_gbps,
// mooncake_ssd_gbps, mooncake_first_chunk_ms, lmcache_cpu_gbps,
// lmcache_disk_gbps, lmcache_first_chunk_ms, daemon_shm_restore_gbps,
// ssd_first_layer_ms, the goal ratios, tiered_model and peer_errors at the
// top (largest size); each size row's runs gain the peer runs.
void AddPeerJson(const BenchReport& report, nlohmann::json& j);
// The peers' table (after FormatTable's), with the tiered model's figures.
std::string FormatPeerTable(const BenchReport& report);

// bench serve: per-object get latency of a `value_bytes` value from a
// Mooncake Store started here (DRAM pool, DummyClient, one client, closed
// loop, `count` gets). {"get_p50_us", "get_p99_us", ...} or {"error": ...}.
nlohmann::json MeasureMooncakeGets(const std::string& dir, uint32_t value_bytes, uint32_t count);

}  // namespace flatkv::tools
