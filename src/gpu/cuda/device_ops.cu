// DeviceOps on CUDA (gpu/device_ops.h): the int8 and kivi decoders (their
// arithmetic in gpu/group_dequant.h, shared with the host test), the block
// checksums and the spin kernel, on a non-blocking stream of their own.
#include <cuda_runtime.h>

#include "gpu/cuda/cuda_util.h"
#include "gpu/cuda/kernels.h"
#include "gpu/device_ops.h"
#include "gpu/group_dequant.h"
#include "gpu/xxh3.h"

namespace flatkv::gpu {
namespace {

__constant__ uint8_t kDeviceSecret[xxh3::kSecretBytes] = FLATKV_XXH3_SECRET;

// One thread a slice: XXH3-64 as gpu/xxh3.h (checked against libxxhash on the CPU).
__global__ void ChecksumKernel(const uint8_t* slices, uint32_t n, uint64_t bytes, uint64_t stride, uint64_t* out) {
  const uint32_t j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j < n) out[j] = xxh3::Hash64(slices + uint64_t(j) * stride, bytes, kDeviceSecret);
}

// One thread per element of a section (an int8::Part or a kivi::Part):
// gpu/group_dequant.h's Element for its codec (lo + step * code, never
// fused), then the dtype (StoreElement), both checked on the host against
// the CPU codec.
template <typename P>
__global__ void DecodeSection(const uint8_t* body, P p, int wide, int dtype, std::byte* out) {
  const uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= uint64_t(p.rows) * p.width) return;
  const uint32_t row = uint32_t(i / p.width), c = uint32_t(i % p.width);
  StoreElement(dtype, Element(body, p, wide != 0, row, c), out, p.base + uint64_t(row) * p.row_stride + c);
}

// Queues one DecodeSection per section of a slice parsed on the host.
template <typename P>
Status LaunchSections(cudaStream_t stream, const SliceLayout& layout, const ParsedSlice<P>& s,
                      const std::byte* device_slice, std::byte* device_out) {
  const uint8_t* body = reinterpret_cast<const uint8_t*>(device_slice + s.body);
  for (uint32_t k = 0; k < s.parts; ++k) {
    const uint64_t n = uint64_t(s.part[k].rows) * s.part[k].width;
    DecodeSection<<<unsigned((n + 255) / 256), 256, 0, stream>>>(body, s.part[k], s.wide ? 1 : 0,
                                                                 int(layout.shape.dtype), device_out);
    FLATKV_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "DecodeSection launch"));
  }
  return Status::Ok();
}

Status CheckDType(const SliceLayout& layout, const char* codec) {
  if (layout.shape.dtype != DType::kF32 && layout.shape.dtype != DType::kF16 && layout.shape.dtype != DType::kBF16)
    return Status::InvalidArgument(std::string("gpu ") + codec + " decode: dtype not f32, f16 or bf16");
  return Status::Ok();
}

__global__ void SpinKernel(uint64_t cycles) {
  const long long start = clock64();
  while (uint64_t(clock64() - start) < cycles) {
  }
}

class CudaDeviceOps final : public DeviceOps {
 public:
  explicit CudaDeviceOps(int device) : device_(device) {}
  ~CudaDeviceOps() override {
    if (stream_) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }
  Status Init() {
    FLATKV_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
    int khz = 0;
    FLATKV_RETURN_IF_ERROR(CudaStatus(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device_), "clock rate"));
    cycles_per_ns_ = khz / 1e6;
    return CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  Status DecodeInt8(const SliceLayout& layout, std::span<const std::byte> host_slice, const std::byte* device_slice,
                    std::byte* device_out) override {
    cudaSetDevice(device_);
    return LaunchInt8Decode(stream_, layout, host_slice, device_slice, device_out);
  }
  Status DecodeKivi(const SliceLayout& layout, std::span<const std::byte> host_slice, const std::byte* device_slice,
                    std::byte* device_out) override {
    cudaSetDevice(device_);
    return LaunchKiviDecode(stream_, layout, host_slice, device_slice, device_out);
  }
  Status Checksums(const std::byte* slices, uint32_t n, uint64_t bytes, uint64_t stride, uint64_t* out) override {
    cudaSetDevice(device_);
    return LaunchBlockChecksums(stream_, slices, n, bytes, stride, out);
  }
  Status Spin(uint64_t ns) override {
    cudaSetDevice(device_);
    SpinKernel<<<1, 1, 0, stream_>>>(uint64_t(ns * cycles_per_ns_));
    return CudaStatus(cudaGetLastError(), "SpinKernel launch");
  }
  Status Sync() override {
    cudaSetDevice(device_);
    return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
  double cycles_per_ns_ = 1.0;
};

}  // namespace

Status LaunchInt8Decode(cudaStream_t stream, const SliceLayout& layout, std::span<const std::byte> host_slice,
                        const std::byte* device_slice, std::byte* device_out) {
  FLATKV_RETURN_IF_ERROR(CheckDType(layout, "int8"));
  FLATKV_ASSIGN_OR_RETURN(int8::Slice s, int8::ParseSlice(layout, host_slice));
  return LaunchSections(stream, layout, s, device_slice, device_out);
}

Status LaunchKiviDecode(cudaStream_t stream, const SliceLayout& layout, std::span<const std::byte> host_slice,
                        const std::byte* device_slice, std::byte* device_out) {
  FLATKV_RETURN_IF_ERROR(CheckDType(layout, "kivi"));
  FLATKV_ASSIGN_OR_RETURN(kivi::Slice s, kivi::ParseSlice(layout, host_slice));
  return LaunchSections(stream, layout, s, device_slice, device_out);
}

Status LaunchBlockChecksums(cudaStream_t stream, const std::byte* slices, uint32_t n, uint64_t bytes, uint64_t stride,
                            uint64_t* out) {
  if (n == 0) return Status::Ok();
  if (stride < bytes)
    return Status::InvalidArgument("gpu checksums: stride " + std::to_string(stride) + " under the slice's " +
                                   std::to_string(bytes) + " bytes");
  ChecksumKernel<<<(n + 63) / 64, 64, 0, stream>>>(reinterpret_cast<const uint8_t*>(slices), n, bytes, stride, out);
  return CudaStatus(cudaGetLastError(), "ChecksumKernel launch");
}

Result<std::unique_ptr<DeviceOps>> DeviceOps::Open(int device) {
  auto ops = std::make_unique<CudaDeviceOps>(device);
  FLATKV_RETURN_IF_ERROR(ops->Init());
  return std::unique_ptr<DeviceOps>(std::move(ops));
}

}  // namespace flatkv::gpu
