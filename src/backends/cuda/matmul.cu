// matmul.h: argument checks, the choice of kernel, and the scalar kernel that
// serves any shape and alignment. The fast kernels are in matmul_matvec.cu
// (decode) and matmul_gemm.cu (prefill); the weight decoders they share are in
// matmul_decode.cuh. docs/cuda-kernels.md ("Matmul") describes the design.
#include "backends/cuda/pointer_alignment.h"
#include "backends/cuda/matmul.h"

#include <algorithm>
#include <climits>
#include <string>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"
#include "backends/cuda/matmul_internal.cuh"
#include "backends/cuda/prefill_plan.h"
#include "common/error.h"
#include "quant/block_types.h"

namespace m40::cuda {

namespace mm {

namespace {

constexpr int kScalarThreads = 128;  // a warp per row
constexpr int kScalarTokens = 8;     // tokens per block (grid.y covers the rest)

// Value c of a row, one at a time, for the scalar kernel.
struct ElementF32 {
  __device__ static float value(const uint8_t* row, int c) { return __ldg(reinterpret_cast<const float*>(row) + c); }
};
struct ElementF16 {
  __device__ static float value(const uint8_t* row, int c) { return widen_half(load_2(row + 2 * c)); }
};
struct ElementBF16 {
  __device__ static float value(const uint8_t* row, int c) { return quant::bf16_to_float(load_2(row + 2 * c)); }
};
template <class Block>
struct ElementOfBlock {
  __device__ static float value(const uint8_t* row, int c) {
    return quant::dequantize_value(reinterpret_cast<const Block*>(row)[c / Block::kValues], c % Block::kValues);
  }
};

template <class Element>
__global__ void __launch_bounds__(kScalarThreads)
    scalar_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int rows, int cols, const float* __restrict__ x,
                  int n_tokens, float* y, const float* residual, ExpertGrouping grouping) {
  M40_SELECT_EXPERT_ITEM(grouping, static_cast<int>(blockIdx.z), w, x, cols, y, rows, n_tokens);
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int row = static_cast<int>(blockIdx.x) * (kScalarThreads / 32) + static_cast<int>(threadIdx.x) / 32;
  const int token0 = static_cast<int>(blockIdx.y) * kScalarTokens;
  const uint8_t* row_ptr = w + static_cast<size_t>(min(row, rows - 1)) * row_bytes;
  const float* x_rows[kScalarTokens];
#pragma unroll
  for (int t = 0; t < kScalarTokens; ++t) {
    x_rows[t] = x + static_cast<size_t>(min(token0 + t, n_tokens - 1)) * static_cast<size_t>(cols);
  }
  float acc[kScalarTokens] = {};
  for (int c = lane; c < cols; c += 32) {
    const float value = Element::value(row_ptr, c);
#pragma unroll
    for (int t = 0; t < kScalarTokens; ++t) acc[t] = fmaf(value, __ldg(x_rows[t] + c), acc[t]);
  }
#pragma unroll
  for (int t = 0; t < kScalarTokens; ++t) {
#pragma unroll
    for (int offset = 16; offset >= 1; offset /= 2) acc[t] += __shfl_xor_sync(0xFFFFFFFFu, acc[t], offset);
  }
  if (lane == 0 && row < rows) {
#pragma unroll
    for (int t = 0; t < kScalarTokens; ++t) {
      if (token0 + t < n_tokens) {
        const size_t index = static_cast<size_t>(token0 + t) * static_cast<size_t>(rows) + static_cast<size_t>(row);
        y[index] = residual != nullptr ? residual[index] + acc[t] : acc[t];
      }
    }
  }
}

template <class Element>
void launch_scalar_kernel(const Product& p) {
  constexpr int kRowsPerBlock = kScalarThreads / 32;
  // grid.z: a grouped product's work items.
  const dim3 grid((p.rows + kRowsPerBlock - 1) / kRowsPerBlock, (p.n_tokens + kScalarTokens - 1) / kScalarTokens,
                  p.grouping.items != nullptr ? p.grouping.n_items : 1);
  scalar_kernel<Element><<<grid, kScalarThreads, 0, p.stream>>>(p.w, p.row_bytes, p.rows, p.cols, p.x, p.n_tokens,
                                                                p.y, p.residual, p.grouping);
  M40_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_scalar(const Product& p) {
  using gguf::TensorType;
  switch (p.type) {
    case TensorType::F32: return launch_scalar_kernel<ElementF32>(p);
    case TensorType::F16: return launch_scalar_kernel<ElementF16>(p);
    case TensorType::BF16: return launch_scalar_kernel<ElementBF16>(p);
    default:
      quant::visit_block_type(p.type, [&](auto tag) {
        launch_scalar_kernel<ElementOfBlock<typename decltype(tag)::type>>(p);
      });
  }
}

}  // namespace mm

namespace {

using gguf::TensorType;

std::string type_name(TensorType type) {
  if (const auto traits = gguf::find_tensor_type(static_cast<uint32_t>(type))) return std::string(traits->name);
  return "type id " + std::to_string(static_cast<uint32_t>(type));
}


// Checks the product and returns it in the kernels' terms; throws m40::Error
// naming the problem.
mm::Product checked_product(const char* what, const DeviceWeight& w, const float* x, int n_tokens, float* y,
                            const float* residual, cudaStream_t stream) {
  const std::string where = std::string(what) + ": ";
  const bool float_type = w.type == TensorType::F32 || w.type == TensorType::F16 || w.type == TensorType::BF16;
  if (!float_type && !quant::visit_block_type(w.type, [](auto) {})) {
    throw Error(where + "weight type " + type_name(w.type) +
                " is not supported on the GPU: m40-llm multiplies F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, "
                "Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS weights");
  }
  const auto& traits = gguf::tensor_type_traits(w.type);
  if (w.rows < 0 || w.cols < 0 || w.rows > INT_MAX || w.cols > INT_MAX) {
    throw Error(where + "weight shape " + std::to_string(w.rows) + " x " + std::to_string(w.cols) +
                " is out of range");
  }
  if (n_tokens < 0) throw Error(where + "negative token count " + std::to_string(n_tokens));
  if (w.cols % traits.block_size != 0) {
    throw Error(where + std::to_string(w.cols) + " columns of " + type_name(w.type) +
                " are not a whole number of blocks of " + std::to_string(traits.block_size));
  }
  const size_t min_row_bytes = static_cast<size_t>(w.cols) / traits.block_size * traits.bytes_per_block;
  if (w.row_bytes < min_row_bytes) {
    throw Error(where + "row stride of " + std::to_string(w.row_bytes) + " bytes is shorter than a row of " +
                std::to_string(w.cols) + " " + type_name(w.type) + " values (" + std::to_string(min_row_bytes) +
                " bytes)");
  }
  // Block structs hold 16-bit fields; F32 rows are read as floats.
  const size_t alignment = w.type == TensorType::F32 ? 4 : 2;
  if (!aligned(w.data, alignment) || w.row_bytes % alignment != 0) {
    throw Error(where + type_name(w.type) + " weights must be " + std::to_string(alignment) +
                "-byte aligned (rows and start)");
  }
  if (!aligned(x, 4) || !aligned(y, 4) || !aligned(residual, 4)) {
    throw Error(where + "activations must be float-aligned");
  }
  const bool work = w.rows > 0 && n_tokens > 0;
  if (work && (w.data == nullptr && w.cols > 0)) throw Error(where + "weight data is null");
  if (work && (y == nullptr || (x == nullptr && w.cols > 0))) throw Error(where + "x or y is null");

  mm::Product p;
  p.type = w.type;
  p.w = static_cast<const uint8_t*>(w.data);
  p.row_bytes = w.row_bytes;
  p.rows = static_cast<int>(w.rows);
  p.cols = static_cast<int>(w.cols);
  p.x = x;
  p.n_tokens = n_tokens;
  p.y = y;
  p.residual = residual;
  p.stream = stream;
  return p;
}

// Whether the decoders' vector loads may be used: rows and x start on the
// alignment their loads need, and rows are whole units.
bool fast_path_fits(const mm::Product& p) {
  size_t alignment = 2;  // 2-byte-aligned loads of the 18/34/210-byte blocks
  int unit = 16;
  switch (p.type) {
    case TensorType::F32:
    case TensorType::F16:
    case TensorType::BF16: alignment = 16, unit = 8; break;
    case TensorType::Q4_K:
    case TensorType::Q5_K: alignment = 16; break;
    case TensorType::Q4_1:
    case TensorType::Q2_K: alignment = 4; break;  // 4-byte loads of the 20- and 84-byte blocks
    case TensorType::IQ4_XS: alignment = 8; break;  // 8-byte loads of the 136-byte blocks
    default: break;
  }
  return p.cols % unit == 0 && aligned(p.w, alignment) && p.row_bytes % alignment == 0 && aligned(p.x, 16);
}

// W x = 0 for an empty row: y = residual (or zeros).
void store_empty_product(const mm::Product& p) {
  const size_t bytes = static_cast<size_t>(p.n_tokens) * static_cast<size_t>(p.rows) * sizeof(float);
  if (p.residual == nullptr) {
    M40_CUDA_CHECK(cudaMemsetAsync(p.y, 0, bytes, p.stream));
  } else if (p.residual != p.y) {
    M40_CUDA_CHECK(cudaMemcpyAsync(p.y, p.residual, bytes, cudaMemcpyDeviceToDevice, p.stream));
  }
}

}  // namespace

// (H200, 32 tokens: Q8_0 11008x4096 147 us in two matvec launches against
// 168 in the decode tile, 4096x4096 62 against 69; the other formats are
// faster in the tile.)
bool tiles_load_slowly(gguf::TensorType type) {
  return type == TensorType::Q8_0 || type == TensorType::Q4_0 || type == TensorType::IQ4_NL;
}

bool matvec_supported(gguf::TensorType type) {
  switch (type) {
    case TensorType::F32:
    case TensorType::F16:
    case TensorType::BF16:
    case TensorType::Q8_0:
    case TensorType::Q4_0:
    case TensorType::Q4_K:
    case TensorType::Q5_K:
    case TensorType::Q6_K:
    case TensorType::IQ4_NL:
    case TensorType::Q4_1:
    case TensorType::Q5_0:
    case TensorType::Q5_1:
    case TensorType::Q2_K:
    case TensorType::Q3_K:
    case TensorType::IQ4_XS: return true;
    default: return false;
  }
}

void matvec(const DeviceWeight& w, const float* x, int n_tokens, float* y, const float* residual,
            cudaStream_t stream) {
  const mm::Product p = checked_product("matvec", w, x, n_tokens, y, residual, stream);
  if (p.rows == 0 || p.n_tokens == 0) return;
  if (p.cols == 0) return store_empty_product(p);
  // Past 16 tokens the work goes to the gemm kernel's decode tiles (K steps of
  // 16 columns: cols % 32 is more than they need).
  if (!fast_path_fits(p) || (p.n_tokens > mm::kMaxMatvecKernelTokens && p.cols % 32 != 0)) {
    return mm::launch_scalar(p);
  }
  // More tokens than one kernel batches: chunks of kMaxMatvecTokens (gemm()
  // is the better choice there).
  for (int t0 = 0; t0 < p.n_tokens; t0 += kMaxMatvecTokens) {
    mm::launch_matvec(p.token_slice(t0, std::min(kMaxMatvecTokens, p.n_tokens - t0)));
  }
}

static_assert(kMaxFusedTokens == mm::kMaxMatvecKernelTokens, "fused products are the matvec kernel's");

namespace {

// A fused product's parts checked against its weight (`what` names the
// caller), set on the checked product.
mm::Product parts_product(const char* what, const DeviceWeight& w, const float* x, int n_tokens,
                          const OutputPart* parts, int n_parts, cudaStream_t stream) {
  const std::string where = std::string(what) + ": ";
  if (n_parts < 1 || n_parts > kMaxOutputParts) {
    throw Error(where + std::to_string(n_parts) + " parts (1 to " + std::to_string(kMaxOutputParts) + ")");
  }
  int64_t total = 0;
  for (int i = 0; i < n_parts; ++i) {
    if (parts[i].rows <= 0 || parts[i].y == nullptr) throw Error(where + "part " + std::to_string(i) + " is empty");
    total += parts[i].rows;
  }
  if (total != w.rows) {
    throw Error(where + "the parts have " + std::to_string(total) + " rows, the weight " + std::to_string(w.rows));
  }
  mm::Product p = checked_product(what, w, x, n_tokens, parts[0].y, nullptr, stream);
  p.parts.n = n_parts;
  int end = 0;
  for (int i = 0; i < n_parts; ++i) {
    end += static_cast<int>(parts[i].rows);
    p.parts.end[i] = end;
    p.parts.y[i] = parts[i].y;
  }
  return p;
}

}  // namespace

bool matvec_parts(const DeviceWeight& w, const float* x, int n_tokens, const OutputPart* parts, int n_parts,
                  cudaStream_t stream) {
  const mm::Product p = parts_product("matvec_parts", w, x, n_tokens, parts, n_parts, stream);
  if (p.rows == 0 || p.n_tokens == 0) return true;
  if (n_tokens > kMaxFusedTokens || p.cols == 0 || !fast_path_fits(p)) return false;
  mm::launch_matvec(p);
  return true;
}

bool matvec_pair(const DeviceWeight& w, const OutputPart* parts, int n_parts, const DeviceWeight& other, float* y_other,
                 const float* x, int n_tokens, cudaStream_t stream) {
  const mm::Product a = parts_product("matvec_pair", w, x, n_tokens, parts, n_parts, stream);
  const mm::Product b = checked_product("matvec_pair", other, x, n_tokens, y_other, nullptr, stream);
  if (n_tokens != 1 || a.rows == 0 || b.rows == 0 || a.cols == 0 || b.cols == 0) return false;
  if (!fast_path_fits(a) || !fast_path_fits(b)) return false;
  return mm::launch_matvec_pair(a, b);
}

namespace {

// A gated product checked against its weight (`what` names the caller).
mm::Product gated_product(const char* what, const DeviceWeight& w, int64_t gate_rows, GatedActivation act,
                          const float* x, int n_tokens, float* y, cudaStream_t stream) {
  const std::string where = std::string(what) + ": ";
  if (act == GatedActivation::None) throw Error(where + "no activation");
  if (gate_rows <= 0 || w.rows != 2 * gate_rows || w.rows > INT_MAX) {
    throw Error(where + std::to_string(w.rows) + " rows are not a gate and an up matrix of " +
                std::to_string(gate_rows) + " rows");
  }
  // (Checked as the gate rows' product: y holds gate_rows a token.)
  DeviceWeight gate = w;
  gate.rows = gate_rows;
  mm::Product p = checked_product(what, gate, x, n_tokens, y, nullptr, stream);
  p.rows = static_cast<int>(w.rows);
  p.parts.activation = act;
  p.parts.gate_rows = static_cast<int>(gate_rows);
  return p;
}

// Whether a folded norm's weight can be read as x is (float4s).
bool norm_fits(const FoldedNorm& norm) { return norm.weight != nullptr && aligned(norm.weight, 16); }

}  // namespace

bool matvec_gated(const DeviceWeight& w, int64_t gate_rows, GatedActivation act, const float* x, int n_tokens,
                  float* y, cudaStream_t stream) {
  const mm::Product p = gated_product("matvec_gated", w, gate_rows, act, x, n_tokens, y, stream);
  if (p.n_tokens == 0) return true;
  if (n_tokens > kMaxGatedTokens || p.cols == 0 || !fast_path_fits(p)) return false;
  return mm::launch_matvec_gated(p);
}

bool matvec_parts_normalized(const DeviceWeight& w, const float* x, const FoldedNorm& norm, const OutputPart* parts,
                             int n_parts, cudaStream_t stream) {
  const mm::Product p = parts_product("matvec_parts_normalized", w, x, 1, parts, n_parts, stream);
  if (p.rows == 0 || p.cols == 0 || !fast_path_fits(p) || !norm_fits(norm)) return false;
  return mm::launch_streamed(p, norm);
}

bool matvec_gated_normalized(const DeviceWeight& w, int64_t gate_rows, GatedActivation act, const float* x,
                             const FoldedNorm& norm, float* y, cudaStream_t stream) {
  const mm::Product p = gated_product("matvec_gated_normalized", w, gate_rows, act, x, 1, y, stream);
  if (p.cols == 0 || !fast_path_fits(p) || !norm_fits(norm)) return false;
  return mm::launch_streamed(p, norm);
}

void gemm(const DeviceWeight& w, const float* x, int n_tokens, float* y, const float* residual,
          cudaStream_t stream) {
  const mm::Product p = checked_product("gemm", w, x, n_tokens, y, residual, stream);
  if (p.rows == 0 || p.n_tokens == 0) return;
  if (p.cols == 0) return store_empty_product(p);
  if (p.cols % 32 != 0 || !fast_path_fits(p)) return mm::launch_scalar(p);
  mm::launch_gemm(p);
}

void grouped_matmul(const DeviceWeight& experts, int n_expert, const float* x, bool x_by_token, int item_tokens,
                    const ExpertItem* items, int n_items, float* y, cudaStream_t stream) {
  if (n_expert <= 0 || experts.rows % n_expert != 0) {
    throw Error("grouped_matmul: " + std::to_string(experts.rows) + " rows are not " + std::to_string(n_expert) +
                " experts' matrices");
  }
  if (item_tokens < 1 || item_tokens > kMaxExpertGemmTokens) {
    throw Error("grouped_matmul: " + std::to_string(item_tokens) + " tokens per item (1 to " +
                std::to_string(kMaxExpertGemmTokens) + ")");
  }
  if (x_by_token && item_tokens != 1) throw Error("grouped_matmul: x by token takes items of one token");
  if (n_items < 0 || (n_items > 0 && items == nullptr) || n_items > 65535) {
    throw Error("grouped_matmul: " + std::to_string(n_items) + " work items");
  }
  DeviceWeight one = experts;
  one.rows = experts.rows / n_expert;
  mm::Product p = checked_product("grouped_matmul", one, x, item_tokens, y, nullptr, stream);
  if (p.rows == 0 || n_items == 0) return;
  if (p.cols == 0) throw Error("grouped_matmul: experts of zero columns");
  p.grouping = {items, n_items, one.row_bytes * static_cast<size_t>(one.rows), x_by_token};
  if (!fast_path_fits(p)) return mm::launch_scalar(p);
  if (item_tokens <= kMaxExpertMatvecTokens) return mm::launch_matvec(p);
  if (p.cols % 32 != 0) return mm::launch_scalar(p);
  mm::launch_gemm_grouped(p);
}

namespace {

// Whether the current GPU has so many SMs that the prefill gemm's 128-row x
// 64-token tiles leave most of them idle for a few dozen tokens (a 4096-row
// matrix is 32 tiles): on an H200 (132 SMs) a mixed server step of 72 tokens
// ran 2-3x faster as chunks of 32 through the decode tiles, each reading the
// weights (bench_cuda_matmul, "kernel choice"), before the prefill tiles
// were split over K; decode_chunks_beat_prefill (prefill_plan.h) weighs the
// two now. An M40 (24 SMs) keeps the prefill tiles, which do more FMAs per
// load.
bool many_sms() { return current_multiprocessor_count() >= kManyMultiprocessors; }

}  // namespace

void matmul(const DeviceWeight& w, const float* x, int n_tokens, float* y, const float* residual,
            cudaStream_t stream) {
  if (n_tokens <= kMaxMatvecTokens || (n_tokens <= mm::kMaxChunkedDecodeTokens && many_sms() &&
                                       mm::decode_chunks_beat_prefill(n_tokens))) {
    matvec(w, x, n_tokens, y, residual, stream);
  } else {
    gemm(w, x, n_tokens, y, residual, stream);
  }
}

}  // namespace m40::cuda
