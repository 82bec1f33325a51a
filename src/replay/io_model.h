// IoModel: bandwidth and latency figures that turn one lookup's bytes and
// requests into a restore time, costed alone. A replay times its restores on the node's shared I/O
// (replay/node_io.h, simulator.h); this model gives the policies their own
// timings (tiered's staging holds, from NodeIoModel: the node's figures),
// SimResult::model_restore_s (compared with measured restores in kReal),
// and CalibrateIoModel's measurements of this machine.
//
// Restore time, for one lookup (flat keeps DRAM and SSD on separate queues,
// so the two media are read in parallel):
//
//   t_ssd  = ssd_bytes_read / ssd_read_gbps + ssd_requests * ssd_request_us / ssd_parallel
//   t_dram = dram_bytes_read / dram_path_gbps
//   t_link = (dram_bytes_read + ssd_bytes_useful) / pcie_gbps      (GPU destination only)
//   restore = max(t_ssd, t_dram, t_link)
//
// where dram_path_gbps is pcie_gbps for a GPU destination (DMA from pinned
// host memory) and dram_copy_gbps for a host destination (a memcpy into the
// restore window, which is what a kReal replay measures). SSD data goes
// device -> host -> GPU pipelined by layer, so it only adds to the PCIe link
// term, not to t_ssd.
//
// Defaults (when no node profile is given) are this machine's measured
// figures (shared/MACHINE.md): SSD
// ~2 GB/s at >= 1 MiB with several requests in flight, ~60 us per small
// request at QD1; DRAM memcpy into pre-faulted memory 11 GB/s on one
// thread; PCIe Gen4 x16 ~25 GB/s effective.
//
// Thread-safety: a value.
#pragma once

#include <cstdint>
#include <string>

#include "flatkv/status.h"
#include "replay/policy.h"

namespace flatkv::replay {

struct IoModel {
  double pcie_gbps = 25.0;        // host -> GPU, GB/s (Gen4 x16 effective)
  double dram_copy_gbps = 11.0;   // host memcpy into a pre-faulted window, GB/s (1 thread)
  double ssd_read_gbps = 2.0;     // SSD read bandwidth at >= 1 MiB requests, GB/s
  double ssd_request_us = 60.0;   // per-request latency at QD1, microseconds
  double ssd_parallel = 4.0;      // requests in flight that share the latency (queue depth)
  bool gpu_destination = true;    // restores land in GPU memory over PCIe (false: host window)

  // Seconds to restore what `r` read.
  double RestoreSeconds(const LookupResult& r) const;
  // "pcie=25.0 GB/s dram=11.0 GB/s ssd=2.00 GB/s read + 60 us/request (x4 in flight), GPU destination"
  std::string ToString() const;
};

// Measures dram_copy_gbps, ssd_read_gbps and ssd_request_us on a real Store
// in `dir` (created if missing): one session of `bytes` restored from each
// medium (FixedPlacement, 16 layers of 64 KiB slices), the median of `reps`, and 4 KiB single-block
// restores for the latency. Other fields keep `base`'s values.
Result<IoModel> CalibrateIoModel(const std::string& dir, const IoModel& base, uint64_t bytes = 64ull << 20,
                                 int reps = 3);

}  // namespace flatkv::replay
