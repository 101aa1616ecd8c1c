// Products of a weight matrix in its storage type with FP32 activations:
// y[t][r] = sum_c W[r][c] * x[t][c] (+ residual[t][r] when given), for
// t < n_tokens. Weights are dequantized into FP32 registers; all math is FP32.
// The CPU twin is cpu::matmul (src/backends/cpu/ops.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/device_weight.h"

namespace m40::cuda {

// Decode products (n_tokens small, up to kMaxMatvecTokens): every weight is
// read once for the whole batch. Bandwidth-bound: the target is the card's
// copy bandwidth.
inline constexpr int kMaxMatvecTokens = 32;

// Whether the decode kernels handle a type: F32, F16, BF16 and every block
// format of quant/blocks.h, each with its own decoder (matmul_decode.cuh).
bool matvec_supported(gguf::TensorType type);

// x: [n_tokens][cols] FP32, y: [n_tokens][rows] FP32 (row stride = rows).
// `residual` may be null or equal to y (then y += W x).
void matvec(const DeviceWeight& w, const float* x, int n_tokens, float* y, const float* residual,
            cudaStream_t stream);

// Prefill products (any n_tokens): a tiled FP32 GEMM that dequantizes tiles
// of W on the fly. Same layout and residual rule as matvec.
void gemm(const DeviceWeight& w, const float* x, int n_tokens, float* y, const float* residual,
          cudaStream_t stream);

// A fused decode product: W's rows are the rows of up to kMaxOutputParts
// matrices stored back to back (a layer's Q, K and V, or its gate and up),
// all of one type and width; part i's results go to its own y_i
// [n_tokens][rows_i]. One launch reads x once for all of them (two launches
// of 8 at 9 to 16 tokens for the K-quants, Q4_1, Q5_0 and Q5_1). Applies to n_tokens <= kMaxFusedTokens on the layouts the decode
// kernel reads; returns false (having done nothing) otherwise, and the
// caller runs one matmul per part.
struct OutputPart {
  float* y = nullptr;
  int64_t rows = 0;
};
inline constexpr int kMaxOutputParts = 3;
inline constexpr int kMaxFusedTokens = 16;
bool matvec_parts(const DeviceWeight& w, const float* x, int n_tokens, const OutputPart* parts, int n_parts,
                  cudaStream_t stream);

// A fused product (as matvec_parts) and one more product of the same x in
// one launch, at one token: a layer whose Q and K are of one type and V of
// another (Q4_K_M files store V of half the layers as Q6_K) reads x for all
// three in one launch instead of two. Q4_K beside Q6_K only; returns false
// (having done nothing) for other types, more tokens, or layouts the decode
// kernel does not read, and the caller runs the products apart.
bool matvec_pair(const DeviceWeight& w, const OutputPart* parts, int n_parts, const DeviceWeight& other, float* y_other,
                 const float* x, int n_tokens, cudaStream_t stream);
// A gated decode product (a SwiGLU or GeGLU FFN's first half): W is a
// layer's gate and up matrices back to back (gate_rows rows each, one type
// and width), and y [n_tokens][gate_rows] gets act(gate x) * (up x), the
// activation applied in the product's epilogue: one launch, no gate and up
// arrays and no activation kernel. One and two tokens (the decode step of
// one or two sequences, where the activation's own launch is a few percent
// of the step); returns false (having done nothing) otherwise, and the
// caller runs the products and silu_mul / gelu_mul. Each block computes
// matching gate and up rows, so that both sums meet in the block.
enum class GatedActivation : int { None, Silu, GeluTanh };
inline constexpr int kMaxGatedTokens = 2;
bool matvec_gated(const DeviceWeight& w, int64_t gate_rows, GatedActivation act, const float* x, int n_tokens,
                  float* y, cudaStream_t stream);

// A layer's RMSNorm folded into the one-token product that reads its
// output: the product takes the residual stream x itself and multiplies W
// by rms_norm(x) * weight, as the rms_norm kernel would have written it (no
// norm launch, no normalized copy of x). Only the streamed kernel folds
// (matmul_streamed.cu: one-token Q4_K, Q8_0, Q4_0 and IQ4_XS products of
// rows up to 4096 columns, whose blocks each hold the whole of x); the functions below return false,
// having done nothing, for any other product, and the caller normalizes
// first.
struct FoldedNorm {
  const float* weight = nullptr;  // [cols]
  float eps = 0.0f;
};
bool matvec_parts_normalized(const DeviceWeight& w, const float* x, const FoldedNorm& norm, const OutputPart* parts,
                             int n_parts, cudaStream_t stream);
bool matvec_gated_normalized(const DeviceWeight& w, int64_t gate_rows, GatedActivation act, const float* x,
                             const FoldedNorm& norm, float* y, cudaStream_t stream);

// Grouped products of mixture-of-experts layers (moe.h builds the work).
// `experts` stacks n_expert matrices of rows_per_expert rows each (a GGUF
// *_exps tensor: expert e's rows start at row e * rows_per_expert). y holds
// rows in expert order ([rows][rows_per_expert]); work item i multiplies
// rows first .. first + count - 1 of x ([rows][cols], in the same order) by
// expert `expert`'s matrix into the same rows of y, so every chosen expert's
// weights are read once per item and the others not at all. With
// x_by_token, x is the step's tokens ([n_tokens][cols]) and an item (of one
// row: item_tokens 1) reads its token's row instead, so no gathered copy is
// needed. Items with expert < 0 do nothing (the grid is sized for the most
// items a step can have, so that it can be captured in a graph). count <=
// item_tokens, which picks the kernel: up to kMaxExpertMatvecTokens the
// decode kernel, up to 16 and 32 the 16- and 32-token decode tiles, up to
// kMaxExpertGemmTokens the prefill gemm tile.
struct ExpertItem {
  int32_t expert = -1;
  int32_t first = 0;
  int32_t count = 0;
  int32_t token = 0;  // the token of row `first` (16 bytes in all: one vector load)
};
inline constexpr int kMaxExpertMatvecTokens = 4;
inline constexpr int kMaxExpertGemmTokens = 64;
void grouped_matmul(const DeviceWeight& experts, int n_expert, const float* x, bool x_by_token, int item_tokens,
                    const ExpertItem* items, int n_items, float* y, cudaStream_t stream);

// The block formats whose 2-byte-aligned blocks the gemm tiles load with
// many small loads (Q8_0, Q4_0, IQ4_NL): their 17-32-token products run as
// two matvec launches, and their experts take tiles only from larger shares
// of a step's tokens (expert_tile_share, moe.h).
bool tiles_load_slowly(gguf::TensorType type);
// Picks matvec for n_tokens <= kMaxMatvecTokens, else gemm.
void matmul(const DeviceWeight& w, const float* x, int n_tokens, float* y, const float* residual,
            cudaStream_t stream);

}  // namespace m40::cuda
