// HwProfile: one serving node's hardware, read from a TOML file of named
// profiles (data/hw/profiles.toml; docs/baselines.md "Node profiles").
//
// Every figure in a profile carries a citation: a key `x` needs a string
// `x_source` beside it, or the file is rejected naming `x`. A profile may
// fix the tensor-parallel degree per model (`[name.tp]`, e.g.
// "llama-3.1-70b" = 4); otherwise TensorParallel derives it.
//
// Thread-safety: values and functions of their arguments.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "flatkv/status.h"

namespace flatkv::replay {

struct ServingModel;

struct HwProfile {
  std::string name, description;
  uint32_t gpus = 0;              // GPUs in the node
  double hbm_bytes = 0;           // HBM per GPU, bytes
  double hbm_tbps = 0;            // HBM bandwidth per GPU (peak), TB/s
  double hbm_efficiency = 0;      // fraction of hbm_tbps a decode step achieves
  double tflops = 0;              // dense BF16 tensor TFLOP/s per GPU (peak, no sparsity)
  double mfu = 0;                 // effective fraction of `tflops` in prefill
  double step_overhead_s = 0;     // fixed time per engine step (all-reduces, launches, sampling), seconds
  double pcie_gbps = 0;           // host <-> GPU per GPU and direction, effective GB/s
  double dram_bytes = 0;          // host DRAM in the node, bytes
  double dram_gbps = 0;           // host memory bandwidth usable for KV copies, GB/s
  uint32_t nvme_drives = 0;       // NVMe data drives
  double nvme_read_gbps = 0;      // per drive, sequential read GB/s
  double nvme_write_gbps = 0;     // per drive, sequential write GB/s
  double nvme_read_iops = 0;      // per drive, 4 KiB random read IOPS
  double nvme_latency_us = 0;     // per request at QD1, microseconds
  double net_gbps = 0;            // node network for a remote tier, GB/s
  double net_rtt_us = 0;          // network round trip, microseconds
  // The shared remote tier (Redis Cluster over TCP, flatkv replay --nodes):
  // what one node restores from it, GB/s, and one request's round trip,
  // microseconds. Optional in a file (0: absent); a multi-node replay
  // needs both.
  double remote_gbps = 0;
  double remote_rtt_us = 0;
  // One CPU core's memcpy rate into a host window, GB/s: a policy that
  // copies DRAM hits with threads (CachePolicy::dram_copy_threads, flat's
  // DramQueue) restores them at threads x this, then across the link.
  // Optional in a file (0: absent); such a policy needs it.
  double memcpy_core_gbps = 0;
  // What a layer-wise load costs per layer on the GPU side (waiting on the
  // layer's event, launching its copy), microseconds: a step that waits on
  // a layer-wise load pays layers x this. Optional (0: free).
  double layer_sync_us = 0;
  std::map<std::string, uint32_t> tp;          // model name -> tensor-parallel degree
  std::map<std::string, std::string> sources;  // figure key -> citation
  bool measured_storage = false;  // the storage figures are to be measured (`vm`: --calibrate)
};

// Reads every profile of a TOML file. InvalidArgument names the profile and
// the key that is missing, of the wrong type, out of range or uncited.
Result<std::vector<HwProfile>> LoadHwProfiles(const std::string& path);
// The profile `name` of `path`; the error lists the known names.
Result<HwProfile> FindHwProfile(const std::string& path, std::string_view name);

// The profile's real-valued figures for a report, in the file's order:
// (hbm_bytes, bytes), (hbm_tbps, TB/s), ..., (step_overhead_ms, ms), ...;
// the *_gb figures as bytes (hbm_bytes, dram_bytes), the others in the
// file's units. The counts (gpus, nvme_drives) are not included.
std::vector<std::pair<std::string_view, double>> HwFigures(const HwProfile& profile);

// The profile's tensor-parallel degree for `m`, or else the smallest power
// of two dividing the GPU count whose HBM (at gpu_memory_utilization, less
// the activation reserve) holds the weights and one max-length context of
// KV. InvalidArgument when even all GPUs do not.
Result<uint32_t> TensorParallel(const HwProfile& hw, const ServingModel& m, double gpu_memory_utilization,
                                double activation_reserve_bytes);

}  // namespace flatkv::replay
