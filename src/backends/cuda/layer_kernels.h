// The non-matmul operations of the llama forward pass on the GPU. Each has a
// CPU twin in src/backends/cpu/ops.h (named in its comment) and a test that
// compares the two on random inputs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/device_weight.h"

namespace m40::cuda {

// Embedding lookup: out[t] = row tokens[t] of `table`, dequantized to FP32.
// CPU twin: cpu::get_row. tokens is a device array of n_tokens ids.
void embed_tokens(const DeviceWeight& table, const int32_t* tokens, int n_tokens, float* out, cudaStream_t stream);

// y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight, for n_rows rows of n.
// CPU twin: cpu::rms_norm.
void rms_norm(const float* x, const float* weight, float* y, int n_rows, int n, float eps, cudaStream_t stream);

struct RopeConfig {
  int head_dim = 0;
  int n_rot = 0;
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;
  bool neox = false;                    // false: adjacent pairs (llama); true: pairs n_rot/2 apart
  const float* freq_factors = nullptr;  // device, n_rot/2 divisors, or null
};

// Rotates in place n_heads heads of each of n_tokens vectors (stride
// row_stride floats between tokens), token t at positions[t] (device array).
// CPU twin: cpu::rope.
void rope(float* x, int n_tokens, int n_heads, int row_stride, const int32_t* positions, const RopeConfig& config,
          cudaStream_t stream);

// out = silu(gate) * up over n values. CPU twin: cpu::silu_mul.
void silu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);

// The KV cache of one layer: for each sequence slot, n_ctx positions of
// kv_dim halves (FP16 bits) for K and for V.
struct KvLayer {
  uint16_t* k = nullptr;
  uint16_t* v = nullptr;
  int n_ctx = 0;
  int kv_dim = 0;
};

// Converts K and V of n_tokens tokens (FP32, [n_tokens][kv_dim]) to FP16 and
// stores them at (seq_ids[t], positions[t]). CPU twin: cpu::KvCache::store.
void kv_append(const KvLayer& cache, const float* k, const float* v, const int32_t* seq_ids,
               const int32_t* positions, int n_tokens, cudaStream_t stream);

struct AttentionShape {
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  float scale = 0.0f;  // 1/sqrt(head_dim)
};

// Causal attention for n_tokens query vectors q ([n_tokens][n_head*head_dim]),
// token t of sequence seq_ids[t] attending to that sequence's cached
// positions 0..positions[t]. out has q's layout. Works for decode (one token
// per sequence) and prefill (many tokens of one sequence); GQA maps query
// head h to KV head h / (n_head / n_head_kv). CPU twin: the attention of
// cpu::CpuBackend (scores, softmax, weighted V, in FP32 from FP16 K/V).
// `max_positions` bounds positions[t] + 1 over the batch (sizes scratch).
void attention(const KvLayer& cache, const AttentionShape& shape, const float* q, const int32_t* seq_ids,
               const int32_t* positions, int n_tokens, int max_positions, float* out, cudaStream_t stream);

// The same with the decode kernel at any token count (attention() takes it
// up to 32 tokens): for tokens that are each their sequence's only one, such
// as a decode step of many sequences, which the prefill kernel would take
// one sequence at a time.
void attention_decode(const KvLayer& cache, const AttentionShape& shape, const float* q, const int32_t* seq_ids,
                      const int32_t* positions, int n_tokens, int max_positions, float* out, cudaStream_t stream);

// y += x over n values (residual adds not fused into a product).
void add_in_place(float* y, const float* x, int64_t n, cudaStream_t stream);

}  // namespace m40::cuda
