// Return-code checks for the CUDA runtime and cuBLAS: each failure throws punica::Error(runtime)
// naming the call, the file:line and the library's own message. (NCCL: see nccl_check.h.)
#pragma once
#include <cuda_runtime_api.h>
#include <string>
#include "kernels/common/error.h"

#define PUNICA_CUDA_CHECK(expr)                                                                  \
  do {                                                                                           \
    cudaError_t punica_err_ = (expr);                                                            \
    if (punica_err_ != cudaSuccess)                                                              \
      ::punica::fail(::punica::ErrorKind::runtime,                                               \
                     std::string("CUDA error ") + cudaGetErrorName(punica_err_) + " (" +         \
                         cudaGetErrorString(punica_err_) + ") in " #expr " at " +                \
                         ::punica::where(__FILE__, __LINE__));                                   \
  } while (0)

// After a kernel launch: catches bad configurations without synchronising.
#define PUNICA_CUDA_CHECK_LAUNCH() PUNICA_CUDA_CHECK(cudaGetLastError())
