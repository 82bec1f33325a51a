// DeviceOps on CUDA (gpu/device_ops.h): the int8 and kivi decoders, the block
// checksums and the spin kernel, on a non-blocking stream of their own.
#include <cuda_runtime.h>

#include "codec/codec_internal.h"
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

// The CPU codec's conversions (codec/dtype.h), bit for bit.
__device__ uint16_t FloatToBf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u & 0x007F0000u) ? uint16_t(u >> 16) : uint16_t((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}
__device__ uint16_t FloatToHalf(float f) {
  const uint32_t u = __float_as_uint(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) {
    const uint16_t m = uint16_t((a >> 13) & 0x3FF);
    return uint16_t(sign | 0x7C00 | (m ? m : 0x200));
  }
  if (a >= 0x477FF000u) return uint16_t(sign | 0x7C00);
  if (a >= 0x38800000u) {
    const uint32_t r = a - 0x38000000u;
    const uint32_t rounded = r + 0xFFFu + ((r >> 13) & 1);
    return uint16_t(sign | (rounded >> 13));
  }
  const float scaled = __fmul_rn(__uint_as_float(a), 16777216.0f);
  uint32_t m = uint32_t(scaled);
  const float frac = __fsub_rn(scaled, float(m));
  if (frac > 0.5f || (frac == 0.5f && (m & 1))) ++m;
  return uint16_t(sign | m);
}
__device__ float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  if (exp == 0x1F) return __uint_as_float(sign | 0x7F800000u | (man << 13));
  if (exp != 0) return __uint_as_float(sign | ((exp + 112) << 23) | (man << 13));
  const float v = __fmul_rn(float(man), 5.9604644775390625e-08f);
  return sign ? -v : v;
}

struct Part {
  uint64_t base, meta, codes;  // output element offset; meta and code byte offsets in the body
  uint32_t row_stride, rows, width, head_dim;
};

// One thread per element: y = lo + step * code with lo = -128 * scale
// (kernels.cc DequantScalar), no fused multiply-add, then the dtype.
__global__ void Int8Decode(const uint8_t* body, Part p, int wide, int dtype, std::byte* out) {
  const uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= uint64_t(p.rows) * p.width) return;
  const uint32_t row = uint32_t(i / p.width), c = uint32_t(i % p.width);
  const uint32_t heads = p.width / p.head_dim, h = c / p.head_dim;
  const uint8_t* m = body + p.meta + (uint64_t(row) * heads + h) * (wide ? 4 : 2);
  float scale;
  if (wide) {
    uint32_t bits = uint32_t(m[0]) | uint32_t(m[1]) << 8 | uint32_t(m[2]) << 16 | uint32_t(m[3]) << 24;
    scale = __uint_as_float(bits);
  } else {
    scale = HalfToFloat(uint16_t(m[0] | m[1] << 8));
  }
  const float lo = __fmul_rn(-128.0f, scale);
  const float y = __fadd_rn(lo, __fmul_rn(scale, float(body[p.codes + uint64_t(row) * p.width + c])));
  const uint64_t at = p.base + uint64_t(row) * p.row_stride + c;
  if (dtype == int(DType::kF32)) reinterpret_cast<float*>(out)[at] = y;
  else if (dtype == int(DType::kF16)) reinterpret_cast<uint16_t*>(out)[at] = FloatToHalf(y);
  else reinterpret_cast<uint16_t*>(out)[at] = FloatToBf16(y);
}

// One thread per element of a kivi section: gpu/group_dequant.h's Element
// (lo + step * code, never fused), then the dtype as Int8Decode does.
__global__ void KiviDecode(const uint8_t* body, kivi::Part p, int wide, int dtype, std::byte* out) {
  const uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= uint64_t(p.rows) * p.width) return;
  const uint32_t row = uint32_t(i / p.width), c = uint32_t(i % p.width);
  const float y = kivi::Element(body, p, wide != 0, row, c);
  const uint64_t at = p.base + uint64_t(row) * p.row_stride + c;
  if (dtype == int(DType::kF32)) reinterpret_cast<float*>(out)[at] = y;
  else if (dtype == int(DType::kF16)) reinterpret_cast<uint16_t*>(out)[at] = FloatToHalf(y);
  else reinterpret_cast<uint16_t*>(out)[at] = FloatToBf16(y);
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
  FLATKV_ASSIGN_OR_RETURN(codec::SliceHeader h, codec::ParseHeader(host_slice));
  if (h.codec_id != 1) return Status::InvalidArgument("gpu int8 decode: the slice's codec id is " + std::to_string(h.codec_id));
  if (layout.shape.dtype != DType::kF32 && layout.shape.dtype != DType::kF16 && layout.shape.dtype != DType::kBF16)
    return Status::InvalidArgument("gpu int8 decode: dtype not f32, f16 or bf16");
  const uint64_t start = codec::kHeaderBytes + h.params_bytes;
  const uint64_t body_bytes = codec::kHeaderBytes + h.body_bytes - start;
  if (host_slice.size() < start + body_bytes || body_bytes < 1)
    return Status::Corruption("gpu int8 decode: slice of " + std::to_string(host_slice.size()) + " bytes is truncated");
  const uint8_t wide = uint8_t(host_slice[start]);
  if (wide > 1) return Status::Corruption("int8 decode: bad metadata flag");
  const codec::Sections sec = codec::SplitSlice(layout);
  const uint8_t* body = reinterpret_cast<const uint8_t*>(device_slice + start);
  uint64_t at = 1;
  for (const codec::Section& s : sec.part) {
    if (s.width == 0 || s.rows == 0) continue;
    const uint64_t heads = s.head_dim ? s.width / s.head_dim : 0;
    Part p{s.base, at, at + uint64_t(s.rows) * heads * (wide ? 4 : 2), s.row_stride, s.rows, s.width, s.head_dim};
    at = p.codes + uint64_t(s.rows) * s.width;
    if (at > body_bytes) return Status::Corruption("int8 decode: truncated body");
    const uint64_t n = uint64_t(s.rows) * s.width;
    Int8Decode<<<unsigned((n + 255) / 256), 256, 0, stream>>>(body, p, wide, int(layout.shape.dtype), device_out);
    FLATKV_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "Int8Decode launch"));
  }
  if (at != body_bytes) return Status::Corruption("int8 decode: " + std::to_string(body_bytes - at) + " trailing bytes");
  return Status::Ok();
}

Status LaunchKiviDecode(cudaStream_t stream, const SliceLayout& layout, std::span<const std::byte> host_slice,
                        const std::byte* device_slice, std::byte* device_out) {
  if (layout.shape.dtype != DType::kF32 && layout.shape.dtype != DType::kF16 && layout.shape.dtype != DType::kBF16)
    return Status::InvalidArgument("gpu kivi decode: dtype not f32, f16 or bf16");
  FLATKV_ASSIGN_OR_RETURN(kivi::Slice s, kivi::ParseSlice(layout, host_slice));
  const uint8_t* body = reinterpret_cast<const uint8_t*>(device_slice + s.body);
  for (uint32_t k = 0; k < s.parts; ++k) {
    const uint64_t n = uint64_t(s.part[k].rows) * s.part[k].width;
    KiviDecode<<<unsigned((n + 255) / 256), 256, 0, stream>>>(body, s.part[k], s.wide ? 1 : 0, int(layout.shape.dtype),
                                                              device_out);
    FLATKV_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "KiviDecode launch"));
  }
  return Status::Ok();
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
