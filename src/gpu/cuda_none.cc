// The CUDA side in a build without it (FLATKV_CUDA off; CMakeLists.txt
// leaves this file out when it is on): each entry point names the option.
#include "gpu/copy_backend.h"
#include "gpu/device_ops.h"

namespace flatkv::gpu {
namespace {

Status NoCuda(const char* what) {
  return Status::FailedPrecondition(std::string(what) +
                                    ": this flatkv was built without CUDA; configure with -DFLATKV_CUDA=ON "
                                    "(needs nvcc and /usr/local/cuda)");
}

}  // namespace

Result<std::unique_ptr<CopyBackend>> MakeCudaCopyBackend(int device) { return NoCuda("copy backend 'cuda'"); }

Result<std::unique_ptr<DeviceOps>> DeviceOps::Open(int device) { return NoCuda("device ops"); }

}  // namespace flatkv::gpu
