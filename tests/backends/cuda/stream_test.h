// The GPU kernel tests' fixture: a CUDA stream of their own, and the test
// skipped where there is no CUDA device.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"

namespace m40::test {

class CudaStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    M40_CUDA_CHECK(cudaStreamCreate(&stream_));
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

}  // namespace m40::test
