// Every CUDA runtime call and every kernel launch goes through one of these
// checks: a failure becomes an m40::Error naming the call, where it was made,
// and CUDA's own description, never a silent wrong answer.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "common/error.h"

namespace m40::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* what, const char* file, int line) {
  throw Error(std::string(what) + " failed at " + file + ":" + std::to_string(line) + ": " +
              cudaGetErrorName(status) + ": " + cudaGetErrorString(status));
}

}  // namespace m40::cuda

// M40_CUDA_CHECK(cudaMalloc(&p, bytes));
#define M40_CUDA_CHECK(call)                                                      \
  do {                                                                            \
    const cudaError_t m40_cuda_status_ = (call);                                  \
    if (m40_cuda_status_ != cudaSuccess) {                                        \
      ::m40::cuda::throw_cuda_error(m40_cuda_status_, #call, __FILE__, __LINE__); \
    }                                                                             \
  } while (0)

// Right after kernel<<<...>>>(...): a bad configuration or an earlier
// asynchronous fault shows up here. (Faults inside the kernel itself surface
// at the next synchronizing call, which is checked as well.)
#define M40_CUDA_CHECK_LAUNCH()                                                          \
  do {                                                                                   \
    const cudaError_t m40_cuda_status_ = cudaGetLastError();                             \
    if (m40_cuda_status_ != cudaSuccess) {                                               \
      ::m40::cuda::throw_cuda_error(m40_cuda_status_, "kernel launch", __FILE__, __LINE__); \
    }                                                                                    \
  } while (0)
