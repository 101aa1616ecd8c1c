#include "backends/cuda/dequantize_kernels.h"

#include <algorithm>
#include <string>

#include "backends/cuda/cuda_check.h"
#include "common/error.h"
#include "quant/block_types.h"
#include "quant/blocks.h"
#include "quant/fp16.h"

namespace m40::cuda {

namespace {

// Each CUDA block writes chunks of 256 consecutive values, one per thread, so
// a warp stores one contiguous 128-byte line. A chunk is one 256-value
// super-block or eight 32-value blocks; the threads of a warp read the same
// block header (a broadcast) and neighbouring quant bytes.
constexpr int kThreadsPerBlock = 256;
// Enough blocks to fill any GPU; larger tensors loop (grid-stride).
constexpr int64_t kMaxGridBlocks = 4096;

int grid_blocks_for(int64_t n) {
  const int64_t chunks = (n + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return static_cast<int>(std::min(chunks, kMaxGridBlocks));
}

template <class Block>
__global__ void __launch_bounds__(kThreadsPerBlock)
    dequantize_blocks_kernel(const Block* __restrict__ src, float* __restrict__ dst, int64_t n) {
  static_assert(kThreadsPerBlock % Block::kValues == 0, "a chunk holds whole blocks");
  constexpr int kBlocksPerChunk = kThreadsPerBlock / Block::kValues;
  const int value_in_block = static_cast<int>(threadIdx.x) % Block::kValues;
  const int block_in_chunk = static_cast<int>(threadIdx.x) / Block::kValues;
  for (int64_t chunk = blockIdx.x; chunk * kThreadsPerBlock < n; chunk += gridDim.x) {
    const int64_t i = chunk * kThreadsPerBlock + threadIdx.x;
    if (i < n) {
      dst[i] = quant::dequantize_value(src[chunk * kBlocksPerChunk + block_in_chunk], value_in_block);
    }
  }
}

__global__ void __launch_bounds__(kThreadsPerBlock)
    halves_to_floats_kernel(const uint16_t* __restrict__ src, float* __restrict__ dst, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreadsPerBlock;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreadsPerBlock + threadIdx.x; i < n; i += stride) {
    dst[i] = quant::half_to_float(src[i]);
  }
}

__global__ void __launch_bounds__(kThreadsPerBlock)
    bf16s_to_floats_kernel(const uint16_t* __restrict__ src, float* __restrict__ dst, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreadsPerBlock;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreadsPerBlock + threadIdx.x; i < n; i += stride) {
    dst[i] = quant::bf16_to_float(src[i]);
  }
}

template <class Block>
void launch_blocks_kernel(const void* d_src, float* d_dst, int64_t n, cudaStream_t stream) {
  dequantize_blocks_kernel<Block>
      <<<grid_blocks_for(n), kThreadsPerBlock, 0, stream>>>(static_cast<const Block*>(d_src), d_dst, n);
  M40_CUDA_CHECK_LAUNCH();
}

std::string type_name(gguf::TensorType type) {
  if (const auto traits = gguf::find_tensor_type(static_cast<uint32_t>(type))) {
    return std::string(traits->name);
  }
  return "type id " + std::to_string(static_cast<uint32_t>(type));
}

}  // namespace

bool can_dequantize_on_device(gguf::TensorType type) {
  using gguf::TensorType;
  if (type == TensorType::F32 || type == TensorType::F16 || type == TensorType::BF16) return true;
  return quant::visit_block_type(type, [](auto) {});
}

void dequantize_on_device(gguf::TensorType type, const void* d_src, float* d_dst, int64_t n,
                          cudaStream_t stream) {
  using gguf::TensorType;
  if (n < 0) throw Error("dequantize_on_device: negative value count " + std::to_string(n));
  const bool known = type == TensorType::F32 || type == TensorType::F16 || type == TensorType::BF16 ||
                     quant::visit_block_type(type, [&](auto tag) {
                       using Block = typename decltype(tag)::type;
                       if (n % Block::kValues != 0) {
                         throw Error("cannot dequantize " + std::to_string(n) + " values of " + type_name(type) +
                                     " on the GPU: not a multiple of its block size " +
                                     std::to_string(Block::kValues));
                       }
                     });
  if (!known) {
    throw Error("cannot dequantize tensor type " + type_name(type) +
                " on the GPU: m40-llm supports F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, "
                "Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS");
  }
  if (n == 0) return;

  switch (type) {
    case TensorType::F32:
      M40_CUDA_CHECK(cudaMemcpyAsync(d_dst, d_src, static_cast<size_t>(n) * sizeof(float),
                                     cudaMemcpyDeviceToDevice, stream));
      return;
    case TensorType::F16:
      halves_to_floats_kernel<<<grid_blocks_for(n), kThreadsPerBlock, 0, stream>>>(
          static_cast<const uint16_t*>(d_src), d_dst, n);
      M40_CUDA_CHECK_LAUNCH();
      return;
    case TensorType::BF16:
      bf16s_to_floats_kernel<<<grid_blocks_for(n), kThreadsPerBlock, 0, stream>>>(
          static_cast<const uint16_t*>(d_src), d_dst, n);
      M40_CUDA_CHECK_LAUNCH();
      return;
    default:
      quant::visit_block_type(type, [&](auto tag) {
        launch_blocks_kernel<typename decltype(tag)::type>(d_src, d_dst, n, stream);
      });
  }
}

}  // namespace m40::cuda
