// Embedding lookup: a gather of token rows from the embedding table in its
// storage type, dequantized to FP32. CPU twin: cpu::get_row, which runs
// quant::dequantize_row; here each thread decodes one value with the same
// quant/blocks.h functions (dequantize_value), so the rows are equal bit for
// bit.
//
// Grid: x = a chunk of 256 values of a row, y = tokens (grid-stride). A chunk
// is one 256-value super-block or eight 32-value blocks, as in the
// dequantize kernels: a warp stores one 128-byte line.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/layer_kernels.h"
#include "common/error.h"
#include "quant/block_types.h"
#include "quant/blocks.h"
#include "quant/fp16.h"

namespace m40::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxGridY = 65535;

struct GatherArgs {
  const uint8_t* table;
  size_t row_bytes;
  int64_t rows;
  int64_t cols;
  const int32_t* tokens;
  int n_tokens;
  float* out;
};

// Decode value i of a row: Source is a block struct, float, or one of the
// 16-bit tags below.
struct F16Tag {};
struct BF16Tag {};

template <class Source>
__device__ __forceinline__ float row_value(const uint8_t* row, int64_t i) {
  if constexpr (std::is_same_v<Source, float>) {
    return __ldg(reinterpret_cast<const float*>(row) + i);
  } else if constexpr (std::is_same_v<Source, F16Tag>) {
    return quant::half_to_float(__ldg(reinterpret_cast<const unsigned short*>(row) + i));
  } else if constexpr (std::is_same_v<Source, BF16Tag>) {
    return quant::bf16_to_float(__ldg(reinterpret_cast<const unsigned short*>(row) + i));
  } else {
    const auto* blocks = reinterpret_cast<const Source*>(row);
    return quant::dequantize_value(blocks[i / Source::kValues], static_cast<int>(i % Source::kValues));
  }
}

// A token id outside the table gives a row of NaN (visible downstream),
// never a read out of bounds. The engine checks ids before they get here.
template <class Source>
__global__ void __launch_bounds__(kThreads) embed_kernel(GatherArgs a) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= a.cols) return;
  for (int t = static_cast<int>(blockIdx.y); t < a.n_tokens; t += static_cast<int>(gridDim.y)) {
    const int32_t token = __ldg(a.tokens + t);
    float value = __int_as_float(0x7fc00000);  // quiet NaN
    if (token >= 0 && token < a.rows) value = row_value<Source>(a.table + static_cast<int64_t>(token) * a.row_bytes, i);
    a.out[static_cast<int64_t>(t) * a.cols + i] = value;
  }
}

template <class Source>
void launch(const GatherArgs& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((a.cols + kThreads - 1) / kThreads),
                  static_cast<unsigned>(std::min(a.n_tokens, kMaxGridY)));
  embed_kernel<Source><<<grid, kThreads, 0, stream>>>(a);
  M40_CUDA_CHECK_LAUNCH();
}

}  // namespace

void embed_tokens(const DeviceWeight& table, const int32_t* tokens, int n_tokens, float* out, cudaStream_t stream) {
  using gguf::TensorType;
  if (n_tokens < 0 || table.cols <= 0 || table.rows <= 0) {
    throw Error("embed_tokens: bad table shape or token count " + std::to_string(n_tokens));
  }
  if (n_tokens == 0) return;
  const GatherArgs a{static_cast<const uint8_t*>(table.data), table.row_bytes, table.rows, table.cols,
                     tokens, n_tokens, out};
  switch (table.type) {
    case TensorType::F32: launch<float>(a, stream); return;
    case TensorType::F16: launch<F16Tag>(a, stream); return;
    case TensorType::BF16: launch<BF16Tag>(a, stream); return;
    default: break;
  }
  const bool known = quant::visit_block_type(table.type, [&](auto tag) {
    using Block = typename decltype(tag)::type;
    if (table.cols % Block::kValues != 0) {
      throw Error("embed_tokens: a row of " + std::to_string(table.cols) + " values is not whole blocks of " +
                  std::to_string(Block::kValues));
    }
    launch<Block>(a, stream);
  });
  if (!known) {
    const auto traits = gguf::find_tensor_type(static_cast<uint32_t>(table.type));
    throw Error("embed_tokens: an embedding table of type " +
                (traits ? std::string(traits->name) : "id " + std::to_string(static_cast<uint32_t>(table.type))) +
                " cannot be dequantized on the GPU");
  }
}

}  // namespace m40::cuda
