// Work on the accelerator beside the copies (docs/gpu.md): the int8 and
// kivi decoders (a store's int8 and kivi slices decoded in device memory,
// bit for bit as the CPU codec decodes them), block checksums computed in device memory,
// and a timed spin kernel that stands for a
// layer's compute in `bench gpu`'s overlap figure. Each DeviceOps has a
// stream of its own, so its work overlaps the copy backend's.
// Without FLATKV_CUDA, Open returns an error naming the build option.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "flatkv/codec.h"
#include "flatkv/status.h"

namespace flatkv::gpu {

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  static Result<std::unique_ptr<DeviceOps>> Open(int device = 0);
  // Queues the decode of one int8 slice, header included: `host_slice` is
  // a host copy of it (its header and metadata flag are read there),
  // `device_slice` the same bytes in device memory; the decoded slice of
  // layout.Bytes() goes to `device_out`.
  virtual Status DecodeInt8(const SliceLayout& layout, std::span<const std::byte> host_slice, const std::byte* device_slice,
                            std::byte* device_out) = 0;
  // The same for one kivi slice (gpu/group_dequant.h: its arithmetic,
  // checked against the CPU codec on the host), one thread an element.
  virtual Status DecodeKivi(const SliceLayout& layout, std::span<const std::byte> host_slice, const std::byte* device_slice,
                            std::byte* device_out) = 0;
  // Queues the block checksums (XXH3-64, gpu/xxh3.h: the store's
  // BlockChecksum, common/checksum.h) of `n` slices of `bytes` each at
  // `slices + j * stride` in device memory, one thread a slice, into device
  // memory `out[0..n)`: the kernel that checks each cuFile read before its
  // layer is valid (the copy backend's Checksums launches the same one).
  virtual Status Checksums(const std::byte* slices, uint32_t n, uint64_t bytes, uint64_t stride, uint64_t* out) = 0;
  // Queues a kernel that spins for about `ns` nanoseconds.
  virtual Status Spin(uint64_t ns) = 0;
  virtual Status Sync() = 0;
};

}  // namespace flatkv::gpu
