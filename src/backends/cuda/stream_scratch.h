// Scratch memory for one launch sequence on one stream, from the device's
// stream-ordered memory pool (cudaMallocAsync / cudaFreeAsync): concurrent
// streams never share it, and CUDA graphs capture it as allocation nodes.
// Used by the split attention (its parts), the split-K decode gemm (its
// partial sums) and the matvec kernel (x copied into lane order).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "backends/cuda/cuda_check.h"

namespace m40::cuda {

// Whether the current device has memory pools (else callers do without
// scratch). Outside a capture, the first call raises the default pool's
// release threshold to 64 MiB, so that the scratch stays cached between
// steps instead of going back to the driver at every synchronization.
bool scratch_pool_ready(cudaStream_t stream);

class StreamScratch {
 public:
  StreamScratch(size_t bytes, cudaStream_t stream) : stream_(stream) {
    M40_CUDA_CHECK(cudaMallocAsync(&ptr_, bytes, stream));
  }
  ~StreamScratch() {
    if (ptr_ != nullptr) cudaFreeAsync(ptr_, stream_);
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  float* floats() const { return static_cast<float*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace m40::cuda
