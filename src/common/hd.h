// FLATKV_HD: a function compiled for the host and, under nvcc, for the
// device too: code written once for both (codec/dtype.h's conversions,
// gpu/xxh3.h, gpu/group_dequant.h), so the CPU tests check what the CUDA
// kernels run.
#pragma once

#if defined(__CUDACC__)
#define FLATKV_HD __host__ __device__
#else
#define FLATKV_HD
#endif
