// The GPU dequantization kernels against the CPU's dequantize_row, on random
// valid blocks of every format: equal bit for bit. Both sides run the same
// functions of quant/blocks.h, and every product that feeds an addition is
// kept unfused on the GPU (quant::mul_unfused), so nothing may differ.
// Output buffers are filled with NaN first, so an unwritten value shows.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/dequantize_kernels.h"
#include "backends/cuda/device.h"
#include "common/error.h"
#include "device_buffer.h"
#include "stream_test.h"
#include "quant/block_types.h"
#include "quant/dequantize.h"
#include "quant/random_blocks.h"

namespace m40::cuda {
namespace {

using gguf::TensorType;
using test::DeviceBuffer;

class DequantizeOnDevice : public test::CudaStreamTest {
 protected:

  // Dequantizes n values of `type` on the GPU and on the CPU and expects the
  // same bits everywhere.
  void expect_same_as_cpu(TensorType type, const std::vector<uint8_t>& bytes, int64_t n) {
    SCOPED_TRACE(std::string(gguf::tensor_type_name(type)) + ", " + std::to_string(n) + " values");
    std::vector<float> cpu(static_cast<size_t>(n));
    quant::dequantize_row(type, bytes.data(), cpu.data(), n);

    DeviceBuffer<uint8_t> d_src(bytes.size());
    DeviceBuffer<float> d_dst(static_cast<size_t>(n));
    M40_CUDA_CHECK(cudaMemcpy(d_src.get(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
    M40_CUDA_CHECK(cudaMemset(d_dst.get(), 0xff, d_dst.bytes()));  // 0xffffffff is a NaN
    dequantize_on_device(type, d_src.get(), d_dst.get(), n, stream_);
    M40_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<float> gpu(static_cast<size_t>(n));
    M40_CUDA_CHECK(cudaMemcpy(gpu.data(), d_dst.get(), d_dst.bytes(), cudaMemcpyDeviceToHost));

    int64_t mismatches = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (std::memcmp(&gpu[i], &cpu[i], sizeof(float)) != 0 && ++mismatches <= 5) {
        ADD_FAILURE() << "value " << i << ": GPU " << gpu[i] << ", CPU " << cpu[i];
      }
    }
    EXPECT_EQ(mismatches, 0);
  }

};

TEST_F(DequantizeOnDevice, EveryBlockFormatMatchesTheCpuBitForBit) {
  for (const TensorType type : test::block_types()) {
    const auto& traits = gguf::tensor_type_traits(type);
    // An odd block count: for 32-value formats the last chunk of 256 is partial.
    const int64_t blocks = traits.block_size == 32 ? 1001 : 333;
    expect_same_as_cpu(type, test::random_valid_blocks(type, blocks, 42), blocks * traits.block_size);
  }
}

// More values than one pass of the grid covers (4096 blocks x 256 threads).
TEST_F(DequantizeOnDevice, LargeTensorsLoopOverTheGrid) {
  expect_same_as_cpu(TensorType::Q4_K, test::random_valid_blocks(TensorType::Q4_K, 12000, 1), 12000 * 256);
  expect_same_as_cpu(TensorType::Q8_0, test::random_valid_blocks(TensorType::Q8_0, 100001, 2), 100001 * 32);
}

std::vector<uint8_t> every_16_bit_pattern() {
  std::vector<uint8_t> bytes(2 * 65536);
  for (uint32_t v = 0; v < 65536; ++v) {
    const auto half = static_cast<uint16_t>(v);
    std::memcpy(bytes.data() + 2 * v, &half, 2);
  }
  return bytes;
}

// Integer-only conversions: even NaN payloads come out the same.
TEST_F(DequantizeOnDevice, F16EveryBitPattern) {
  expect_same_as_cpu(TensorType::F16, every_16_bit_pattern(), 65536);
}

TEST_F(DequantizeOnDevice, BF16EveryBitPattern) {
  expect_same_as_cpu(TensorType::BF16, every_16_bit_pattern(), 65536);
}

TEST_F(DequantizeOnDevice, F32IsACopy) {
  std::vector<uint8_t> bytes(4 * 10000);
  std::mt19937 rng(3);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  expect_same_as_cpu(TensorType::F32, bytes, 10000);
}

TEST_F(DequantizeOnDevice, ZeroValuesLaunchNothing) {
  EXPECT_NO_THROW(dequantize_on_device(TensorType::Q4_K, nullptr, nullptr, 0, stream_));
  M40_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// Argument errors are found before any CUDA call: these run without a GPU.
TEST(DequantizeOnDeviceArguments, UnsupportedTypeIsAnErrorNamingIt) {
  try {
    dequantize_on_device(TensorType::IQ2_XXS, nullptr, nullptr, 256, nullptr);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("IQ2_XXS"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(can_dequantize_on_device(TensorType::Q8_1));
  for (const TensorType type : test::block_types()) EXPECT_TRUE(can_dequantize_on_device(type));
  EXPECT_TRUE(can_dequantize_on_device(TensorType::F16));
}

TEST(DequantizeOnDeviceArguments, PartialBlockIsAnError) {
  try {
    dequantize_on_device(TensorType::Q6_K, nullptr, nullptr, 300, nullptr);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Q6_K"), std::string::npos) << e.what();
  }
  EXPECT_THROW(dequantize_on_device(TensorType::Q8_0, nullptr, nullptr, 33, nullptr), Error);
  EXPECT_THROW(dequantize_on_device(TensorType::Q8_0, nullptr, nullptr, -32, nullptr), Error);
}

}  // namespace
}  // namespace m40::cuda
