// `flatkv bench gpu`: the GPU window's paths (docs/gpu.md): pinned
// host-to-device copies, restores from DRAM and from SSD into device
// memory through the copy backend, a raw O_DIRECT read of the same bytes,
// the int8 decoder, and how well loads overlap a per-layer compute.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace flatkv::tools {

struct BenchGpuArgs {
  std::string backend = "cuda";  // or "cpu": the same run on the CPU backend (no decoder, no device)
  std::string shape = "llama-3.1-8b";
  uint32_t blocks = 64;           // the restored prefix, in 64-token blocks
  uint32_t reps = 3;
  std::string dir;                // scratch parent (default /var/tmp)
  bool json = false;
};

CLI::App* AddBenchGpuCommand(CLI::App& bench, BenchGpuArgs& args);
int RunBenchGpu(const BenchGpuArgs& args);

}  // namespace flatkv::tools
