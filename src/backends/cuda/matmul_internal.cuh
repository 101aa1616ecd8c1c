// Shared between the matmul translation units (matmul.cu: checks and
// dispatch, matmul_matvec.cu, matmul_gemm.cu): the checked arguments, which
// decoder serves which type, and the launchers behind matvec() and gemm().
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "backends/cuda/gated_activation.cuh"
#include "backends/cuda/matmul.h"
#include "backends/cuda/matmul_decode.cuh"
#include "gguf/tensor_type.h"
#include "quant/blocks.h"

namespace m40::cuda::mm {

// Where the matvec kernel stores row r: with n == 0 in y (row stride rows);
// otherwise in y[i] for the part i with end[i - 1] <= r < end[i] (end[-1] =
// 0), at row r - end[i - 1] of a [n_tokens][end[i] - end[i - 1]] array.
// A gated product (activation not None; matvec_gated, one and two tokens):
// rows [0, gate_rows) are gate rows, [gate_rows, 2 gate_rows) the up rows,
// and y receives act(gate) * up, [n_tokens][gate_rows]; n is 0 then.
struct OutputParts {
  int n = 0;
  int end[3] = {0, 0, 0};
  float* y[3] = {nullptr, nullptr, nullptr};
  GatedActivation activation = GatedActivation::None;
  int gate_rows = 0;
};

// Stores the sum of row `row`, token t of a decode product (nothing past
// rows or n_tokens): in the part that holds the row, or in y plus the
// residual.
__device__ __forceinline__ void store_product_sum(const OutputParts& parts, float* y, const float* residual, int rows,
                                                  int n_tokens, int row, int t, float sum) {
  if (t >= n_tokens || row >= rows) return;
  if (parts.n > 0) {
    // (Constant indices: a loop over the parts put them on the stack.)
    float* dst = parts.y[0];
    int first = 0, end = parts.end[0];
    if (parts.n > 1 && row >= parts.end[0]) dst = parts.y[1], first = parts.end[0], end = parts.end[1];
    if (parts.n > 2 && row >= parts.end[1]) dst = parts.y[2], first = parts.end[1], end = parts.end[2];
    dst[static_cast<size_t>(t) * static_cast<size_t>(end - first) + static_cast<size_t>(row - first)] = sum;
    return;
  }
  const size_t index = static_cast<size_t>(t) * static_cast<size_t>(rows) + static_cast<size_t>(row);
  y[index] = residual != nullptr ? residual[index] + sum : sum;
}

// Stores act(gate) * up of gate row `gate_row`, token t of a gated product
// (nothing past the gate rows or n_tokens).
__device__ __forceinline__ void store_gated_sum(const OutputParts& parts, float* y, int n_tokens, int gate_row, int t,
                                                float gate, float up) {
  if (t >= n_tokens || gate_row >= parts.gate_rows) return;
  y[static_cast<size_t>(t) * static_cast<size_t>(parts.gate_rows) + static_cast<size_t>(gate_row)] =
      gated_value(parts.activation, gate, up);
}

// A grouped product (matmul.h, grouped_matmul): the kernel's blocks of
// item index i (a grid dimension) compute work item items[i]: W moved to its
// expert's matrix, x and y to its first row, n_tokens its count.
struct ExpertGrouping {
  const ExpertItem* items = nullptr;  // null: a plain product
  int n_items = 0;
  size_t expert_bytes = 0;  // from one expert's matrix to the next
  bool x_by_token = false;  // x row: the item's token, not its first row
};

// A block's work item: where its expert's matrix and its rows begin, and
// how many rows (tokens) it has; count 0 for none.
struct ExpertItemPlace {
  size_t w_offset = 0;  // bytes
  size_t x_row = 0;
  size_t y_row = 0;
  int count = 0;
};
__device__ __forceinline__ ExpertItemPlace expert_item_place(const ExpertGrouping& g, int item_index) {
  const int4 item = __ldg(reinterpret_cast<const int4*>(g.items) + item_index);
  ExpertItemPlace place;
  if (item.x < 0 || item.z <= 0) return place;
  place.w_offset = static_cast<size_t>(item.x) * g.expert_bytes;
  place.x_row = static_cast<size_t>(g.x_by_token ? item.w : item.y);
  place.y_row = static_cast<size_t>(item.y);
  place.count = item.z;
  return place;
}

// Points a block at its work item; false when it has none. Plain products
// keep their arguments. (A macro: the kernels' pointers are __restrict__.)
#define M40_SELECT_EXPERT_ITEM(grouping, item_index, w, x, x_stride, y, rows, n_tokens)                   \
  do {                                                                                                    \
    if ((grouping).items != nullptr) {                                                                    \
      const ::m40::cuda::mm::ExpertItemPlace place_ = ::m40::cuda::mm::expert_item_place(grouping, item_index); \
      if (place_.count == 0) return;                                                                      \
      (w) += place_.w_offset;                                                                             \
      (x) += place_.x_row * static_cast<size_t>(x_stride);                                                \
      (y) += place_.y_row * static_cast<size_t>(rows);                                                    \
      (n_tokens) = place_.count;                                                                          \
    }                                                                                                     \
  } while (false)

// One product, checked (matmul.cu): row r of W at w + r * row_bytes.
struct Product {
  gguf::TensorType type = gguf::TensorType::F32;
  const uint8_t* w = nullptr;
  size_t row_bytes = 0;
  int rows = 0;
  int cols = 0;
  const float* x = nullptr;  // [n_tokens][cols]
  int n_tokens = 0;
  float* y = nullptr;               // [n_tokens][rows]
  const float* residual = nullptr;  // null, y, or another [n_tokens][rows]
  OutputParts parts;                // the matvec kernel only; residual null then
  ExpertGrouping grouping;          // n_tokens is then the items' largest count
  cudaStream_t stream = nullptr;

  // The same product for tokens first .. first + count - 1.
  Product token_slice(int first, int count) const {
    Product slice = *this;
    const size_t t = static_cast<size_t>(first);
    slice.n_tokens = count;
    slice.x = x + t * static_cast<size_t>(cols);
    // A fused product writes through its parts only (y is the first part's
    // array, fewer rows than the product: no pointer past it is formed).
    if (parts.n == 0) slice.y = y + t * static_cast<size_t>(rows);
    if (residual != nullptr) slice.residual = residual + t * static_cast<size_t>(rows);
    for (int i = 0; i < parts.n; ++i) {
      const int part_rows = parts.end[i] - (i == 0 ? 0 : parts.end[i - 1]);
      slice.parts.y[i] = parts.y[i] + t * static_cast<size_t>(part_rows);
    }
    return slice;
  }
};

// Calls f(std::integral_constant<int, i>{}) for i = 0 .. kCount - 1: loops
// whose index must be a template argument (a decoder's pieces and scale
// groups).
template <class F, int... i>
__device__ __forceinline__ void static_for_impl(F&& f, std::integer_sequence<int, i...>) {
  (f(std::integral_constant<int, i>{}), ...);
}
template <int kCount, class F>
__device__ __forceinline__ void static_for(F&& f) {
  static_for_impl(f, std::make_integer_sequence<int, kCount>{});
}

template <class Decoder>
struct DecoderTag {
  using type = Decoder;
};

// Calls visitor(DecoderTag<D>{}) with the decoder of `type`; false for a type
// no decoder handles.
template <class Visitor>
bool visit_decoder(gguf::TensorType type, Visitor&& visitor) {
  using gguf::TensorType;
  switch (type) {
    case TensorType::F32: visitor(DecoderTag<DecodeF32>{}); return true;
    case TensorType::F16: visitor(DecoderTag<DecodeF16>{}); return true;
    case TensorType::BF16: visitor(DecoderTag<DecodeBF16>{}); return true;
    case TensorType::Q8_0: visitor(DecoderTag<DecodeQ8_0>{}); return true;
    case TensorType::Q4_0: visitor(DecoderTag<DecodeQ4_0>{}); return true;
    case TensorType::IQ4_NL: visitor(DecoderTag<DecodeIQ4_NL>{}); return true;
    case TensorType::Q4_K: visitor(DecoderTag<DecodeQ4_K>{}); return true;
    case TensorType::Q5_K: visitor(DecoderTag<DecodeQ5_K>{}); return true;
    case TensorType::Q6_K: visitor(DecoderTag<DecodeQ6_K>{}); return true;
    case TensorType::Q4_1: visitor(DecoderTag<DecodeQ4_1>{}); return true;
    case TensorType::Q5_0: visitor(DecoderTag<DecodeQ5_0>{}); return true;
    case TensorType::Q5_1: visitor(DecoderTag<DecodeQ5_1>{}); return true;
    case TensorType::Q2_K: visitor(DecoderTag<DecodeQ2_K>{}); return true;
    case TensorType::Q3_K: visitor(DecoderTag<DecodeQ3_K>{}); return true;
    case TensorType::IQ4_XS: visitor(DecoderTag<DecodeIQ4_XS>{}); return true;
    default: return false;
  }
}

// Decode products, n_tokens 1..32, the decoder's alignment holds: the matvec
// kernel up to kMaxMatvecKernelTokens (8 a launch; 9 to 16 in one launch of
// 16, or two of 8 for the K-quants, Q4_1, Q5_0 and Q5_1: cheaper than one
// gemm tile on an H200,
// Q8_0 11008x4096 at 16 tokens 73 us against 143), the gemm kernel with one
// token tile above (launch_gemm_decode; cols % 32 == 0), except for Q8_0,
// Q4_0 and IQ4_NL, which take two matvec launches there too.
inline constexpr int kMaxMatvecKernelTokens = 16;
void launch_matvec(const Product& p);
// A gated product (OutputParts::activation set, 1 to kMaxGatedTokens
// tokens, not grouped: matvec_gated checks) through the matvec kernel;
// false, having launched nothing, for the types whose kernels do not gate
// (the float types).
bool launch_matvec_gated(const Product& p);
// Two one-token products in one launch (matvec_pair_kernel): A, plain or
// with fused parts, and B; false, having launched nothing, for pairs of
// types without a paired kernel (Q4_K beside Q6_K has one).
bool launch_matvec_pair(const Product& a, const Product& b);
// The matvec kernel alone (n_tokens up to kMaxMatvecKernelTokens), whatever
// launch_matvec would choose: for the bench.
void launch_matvec_kernel(const Product& p);

// One- and two-token Q4_K and one-token Q8_0, Q4_0 and IQ4_XS products of
// rows up to 4096 columns, plain, with a residual, in fused parts or gated, x normalized
// first where `norm` has a weight (one token only) (matmul_streamed.cu);
// false, having launched nothing, for any other product.
bool launch_streamed(const Product& p, const FoldedNorm& norm = {});

// Q4_K decode products with eight rows a lane (matmul_skinny.cu):
// launch_matvec sends those of kMinSkinnyTokens..kMaxSkinnyProductTokens
// tokens there (skinny_takes), in launches of up to kMaxSkinnyTokens
// (launch_skinny takes 1 to kMaxSkinnyTokens, plain Q4_K products only).
inline constexpr int kMinSkinnyTokens = 3;
inline constexpr int kMaxSkinnyTokens = 8;
inline constexpr int kMaxSkinnyProductTokens = 16;
bool skinny_takes(const Product& p);
void launch_skinny(const Product& p);
void launch_gemm_decode(const Product& p);

// The second half of a product split over K (matmul_gemm.cu): adds the
// splits' partial sums ([splits][n_tokens][rows] at `partial`) in split
// order and stores them as p's kernel would (residual, fused parts).
void launch_splitk_reduce(const Product& p, const float* partial, int splits);

// The tiled prefill gemm kernel: any n_tokens, cols % 32 == 0, alignment holds.
void launch_gemm(const Product& p);
// A grouped product's items (one token tile each, no split): the 16- or
// 32-token decode tile or the 64-token prefill tile, the smallest that
// holds item_tokens.
inline constexpr int kGroupedGemmTileTokens = 64;
void launch_gemm_grouped(const Product& p);

// Any shape and alignment: one warp per row, element by element (grouped
// products too).
void launch_scalar(const Product& p);

}  // namespace m40::cuda::mm
