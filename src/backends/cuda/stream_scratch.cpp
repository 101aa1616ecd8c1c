#include "backends/cuda/stream_scratch.h"

#include <cstdint>
#include <mutex>
#include <vector>

namespace m40::cuda {

bool scratch_pool_ready(cudaStream_t stream) {
  static std::mutex mutex;
  static std::vector<int> state;  // per device: 0 unknown, 1 ready, 2 unsupported
  int device = 0;
  M40_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  if (state.size() <= static_cast<size_t>(device)) state.resize(static_cast<size_t>(device) + 1, 0);
  int& s = state[static_cast<size_t>(device)];
  if (s == 0) {
    int supported = 0;
    M40_CUDA_CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device));
    if (supported == 0) {
      s = 2;
    } else {
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      M40_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
      if (capture != cudaStreamCaptureStatusNone) return true;  // configure the pool later
      cudaMemPool_t pool = nullptr;
      M40_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
      uint64_t threshold = 0;
      M40_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
      uint64_t wanted = uint64_t{64} << 20;
      if (threshold < wanted) M40_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &wanted));
      s = 1;
    }
  }
  return s == 1;
}

}  // namespace m40::cuda
