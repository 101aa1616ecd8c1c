// A failing CUDA call becomes an m40::Error that names the call, the place
// and CUDA's description. Runs without a GPU: without one, the call fails too.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <string>

#include "backends/cuda/cuda_check.h"
#include "common/error.h"

namespace m40::cuda {
namespace {

TEST(CudaCheck, FailureNamesTheCallThePlaceAndTheReason) {
  try {
    M40_CUDA_CHECK(cudaSetDevice(-1));  // never a valid device
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("cudaSetDevice(-1)"), std::string::npos) << message;
    EXPECT_NE(message.find("test_cuda_check.cpp:"), std::string::npos) << message;
    EXPECT_NE(message.find("cudaError"), std::string::npos) << message;  // the error's name
  }
  (void)cudaGetLastError();
}

TEST(CudaCheck, SuccessPassesQuietly) {
  EXPECT_NO_THROW(M40_CUDA_CHECK(cudaSuccess));
}

TEST(CudaCheck, LaunchCheckReportsAPendingError) {
  (void)cudaSetDevice(-1);  // leaves an error for cudaGetLastError
  try {
    M40_CUDA_CHECK_LAUNCH();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kernel launch failed at"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace m40::cuda
