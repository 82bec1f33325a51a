// Kernels shared by the CUDA backend and DeviceOps (built only with
// FLATKV_CUDA): launched on the caller's stream.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "flatkv/status.h"

namespace flatkv::gpu {

// Queues the block checksums (XXH3-64, gpu/xxh3.h: the store's
// BlockChecksum) of `n` slices of `bytes` each at `slices + j * stride` in
// device memory into device `out[0..n)`, one thread a slice.
Status LaunchBlockChecksums(cudaStream_t stream, const std::byte* slices, uint32_t n, uint64_t bytes, uint64_t stride,
                            uint64_t* out);

}  // namespace flatkv::gpu
