// CUDA runtime errors as flatkv Statuses (built only with FLATKV_CUDA).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "flatkv/status.h"

namespace flatkv::gpu {

inline Status CudaStatus(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status::IoError(what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

}  // namespace flatkv::gpu
