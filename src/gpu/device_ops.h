// Work on the accelerator beside the copies (docs/gpu.md): the int8
// decoder (a store's int8 slices decoded in device memory, bit for bit as
// the CPU codec decodes them) and a timed spin kernel that stands for a
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
  // Queues a kernel that spins for about `ns` nanoseconds.
  virtual Status Spin(uint64_t ns) = 0;
  virtual Status Sync() = 0;
};

}  // namespace flatkv::gpu
