// Kernels shared by the CUDA backend and DeviceOps (gpu/cuda/device_ops.cu;
// built only with FLATKV_CUDA): launched on the caller's stream.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "flatkv/codec.h"
#include "flatkv/status.h"

namespace flatkv::gpu {

// Queues the block checksums (XXH3-64, gpu/xxh3.h: the store's
// BlockChecksum) of `n` slices of `bytes` each at `slices + j * stride` in
// device memory into device `out[0..n)`, one thread a slice.
Status LaunchBlockChecksums(cudaStream_t stream, const std::byte* slices, uint32_t n, uint64_t bytes, uint64_t stride,
                            uint64_t* out);

// Queues the decode of one int8 (or kivi) slice, header included: `host_slice`
// is a host copy of it (its header and parameters are read there),
// `device_slice` the same bytes in device memory; the decoded slice of
// layout.Bytes() goes to device `device_out`. Bit for bit the CPU codec's.
Status LaunchInt8Decode(cudaStream_t stream, const SliceLayout& layout, std::span<const std::byte> host_slice,
                        const std::byte* device_slice, std::byte* device_out);
Status LaunchKiviDecode(cudaStream_t stream, const SliceLayout& layout, std::span<const std::byte> host_slice,
                        const std::byte* device_slice, std::byte* device_out);

}  // namespace flatkv::gpu
