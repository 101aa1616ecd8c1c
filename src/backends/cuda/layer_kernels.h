// The non-matmul operations of the forward pass on the GPU (the llama set and
// the architecture features: biases, per-head Q/K norms, YaRN RoPE, soft-caps,
// sliding windows, post-norms, GELU). Each has a CPU twin in
// src/backends/cpu/ops.h (named in its comment) and a test that compares the
// two on random inputs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/device_weight.h"
#include "quant/blocks.h"

namespace m40::cuda {

// Embedding lookup: out[t] = row tokens[t] of `table`, dequantized to FP32.
// CPU twin: cpu::get_row. tokens is a device array of n_tokens ids.
void embed_tokens(const DeviceWeight& table, const int32_t* tokens, int n_tokens, float* out, cudaStream_t stream);

// y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight, for n_rows rows of n.
// y may be x: the per-head Q/K norms run in place over rows = tokens x heads.
// CPU twin: cpu::rms_norm.
void rms_norm(const float* x, const float* weight, float* y, int n_rows, int n, float eps, cudaStream_t stream);

// The fields of cpu::RopeParams (model::RopeSettings says what each means).
// ext_factor 0 and magnitude 1 (plain and linearly scaled RoPE) compute the
// angles exactly as before YaRN was added.
struct RopeConfig {
  int head_dim = 0;
  int n_rot = 0;
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;
  float ext_factor = 0.0f;              // YaRN: 1 mixes extrapolated and interpolated angles
  float corr_low = 0.0f;                // YaRN ramp bounds (rotary pair indices)
  float corr_high = 0.0f;
  float magnitude = 1.0f;               // cos and sin are multiplied by this
  bool neox = false;                    // false: adjacent pairs (llama); true: pairs n_rot/2 apart
  const float* freq_factors = nullptr;  // device, n_rot/2 divisors, or null
};

// Rotates in place n_heads heads of each of n_tokens vectors (stride
// row_stride floats between tokens), token t at positions[t] (device array).
// CPU twin: cpu::rope.
void rope(float* x, int n_tokens, int n_heads, int row_stride, const int32_t* positions, const RopeConfig& config,
          cudaStream_t stream);

// Q x the attention temperature of its token's position (mistral3, Llama 4):
// 1 + scale * ln(floor(positions[t] / length) + 1), in double as the host
// computes it, for n_tokens rows of row_len values. CPU twin:
// model::ModelHparams::attention_temperature and cpu::scale.
void attention_temperature(float* q, int n_tokens, int row_len, const int32_t* positions, float scale,
                           uint32_t length, cudaStream_t stream);

// out = silu(gate) * up over n values. CPU twin: cpu::silu_mul.
void silu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);

// The same over rows of a fused gate/up product (the MoE experts' gate and
// up stacked per expert): out[r][j] = silu(gate_up[r][j]) *
// gate_up[r][n_ff + j], out [rows][n_ff]. CPU twin: cpu::silu_mul.
void silu_mul_rows(const float* gate_up, int64_t rows, int n_ff, float* out, cudaStream_t stream);

// out = gelu(gate) * up over n values, GELU in its tanh form. CPU twin:
// cpu::gelu_mul.
void gelu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);

// y[r] += bias for n_rows rows of n_cols (the Q/K/V biases after their
// products). CPU twin: cpu::add_in_place per row.
void add_bias(float* y, const float* bias, int n_rows, int n_cols, cudaStream_t stream);

// The same for up to kMaxBiasTargets matrices of n_rows rows in one launch
// (Q, K and V of a layer: one small kernel instead of three).
struct BiasTarget {
  float* y = nullptr;
  const float* bias = nullptr;
  int n_cols = 0;
};
inline constexpr int kMaxBiasTargets = 3;
void add_biases(const BiasTarget* targets, int n_targets, int n_rows, cudaStream_t stream);

// x = x * scale, then (cap > 0) x = cap * tanh(x / cap), over n values: the
// embedding scale (cap 0) and the logits' scale and soft-cap. CPU twin:
// cpu::scale then cpu::softcap.
void scale_and_cap(float* x, int64_t n, float scale, float cap, cudaStream_t stream);

// How a branch's output (attention or FFN) joins the residual stream when
// the matmul epilogue's plain x += W h does not do: the branch plus `bias`,
// RMSNorm'd with `post_norm` (gemma's post-norms), times `scale` (granite's
// residual scale). Null pointers and a scale of 1 are off.
struct BranchJoin {
  const float* bias = nullptr;
  const float* post_norm = nullptr;
  float eps = 0.0f;
  float scale = 1.0f;
  bool plain() const { return bias == nullptr && post_norm == nullptr && scale == 1.0f; }
};

// The norm that follows a branch's join, done in the same pass:
// out = rms_norm(x) * weight (join.eps), after x was updated.
struct NextNorm {
  const float* weight = nullptr;
  float* out = nullptr;  // may be the branch
};

// x[r] += scale * norm(branch[r] + bias) for n_rows rows of n (branch is
// left as it is unless it is next.out), then, when next names a norm,
// next.out[r] = rms_norm(x[r]) * next.weight. CPU twin: the add_branch step
// of cpu::CpuBackend::forward (cpu::add_in_place, cpu::rms_norm,
// cpu::scale), then cpu::rms_norm.
void add_branch(float* x, const float* branch, const BranchJoin& join, int n_rows, int n, cudaStream_t stream,
                const NextNorm& next = {});

// The KV cache of one layer, paged (backends/kv_blocks.h): a pool of
// blocks of kKvBlockSize positions, each position a row of kv_dim values in
// k and in v: halves (FP16 bits) or, for type Q8_0, kv_dim / 32
// quant::BlockQ8_0 blocks of 34 bytes (kv_dim a multiple of 32). Position p
// of sequence s is pool row
// kv_row(block_tables + s * max_blocks, p). block_tables is a device array
// [n_seq][max_blocks] (backend::BlockTables::flat()); max_blocks is at least
// kv_blocks_for(n_ctx). The kernels read the tables from that fixed buffer,
// so a captured decode graph stays valid when the tables change.
// The element type of a CUDA KV cache: backend::KvType without F32 (that
// header is C++20; the kernels compile as C++17). kv_format (memory_plan.h)
// maps one to the other.
enum class KvFormat { F16, Q8_0 };

struct KvLayer {
  void* k = nullptr;
  void* v = nullptr;
  int n_ctx = 0;   // positions per sequence
  int kv_dim = 0;
  const int32_t* block_tables = nullptr;
  int max_blocks = 0;  // the tables' stride
  KvFormat type = KvFormat::F16;
};

// Bytes of one position's K (or V) row in a cache of `type` (F16 or Q8_0).
inline uint64_t kv_row_bytes(KvFormat type, int kv_dim) {
  if (type == KvFormat::Q8_0) {
    return static_cast<uint64_t>(kv_dim) / quant::BlockQ8_0::kValues * sizeof(quant::BlockQ8_0);
  }
  return static_cast<uint64_t>(kv_dim) * 2;
}

// Converts K and V of n_tokens tokens (FP32, [n_tokens][kv_dim]) to FP16 (or
// quantizes them to Q8_0 with quant::quantize_block_q8_0) and stores them at
// the pool row of (seq_ids[t], positions[t]). CPU twin: cpu::KvCache::store.
void kv_append(const KvLayer& cache, const float* k, const float* v, const int32_t* seq_ids,
               const int32_t* positions, int n_tokens, cudaStream_t stream);
// Throws, naming `op`, unless `cache` is a usable layer of the paged cache:
// a context and rows, Q8_0 rows of whole blocks, block tables for n_ctx.
void check_kv_layer(const KvLayer& cache, const char* op);

// Q's, K's and V's heads between their products and the attention, in one
// launch: for each set of rows (token t's heads at x + t * row_stride), each
// head's RMS norm over head_dim values times `norm` where given (qwen3,
// gemma3), then RoPE where `rope` is given and the set is `rotated` (a
// head's values past n_rot are normalized, not rotated), then, where `cache`
// names K or V, the head stored into that half of the KV cache at the pool
// row of (seq_ids[t], positions[t]), as kv_append stores it. CPU twins:
// cpu::rms_norm per head, cpu::rope, cpu::KvCache::store.
enum class HeadCache { None, K, V };
struct HeadRows {
  float* x = nullptr;
  int n_heads = 0;
  int row_stride = 0;
  const float* norm = nullptr;  // head_dim weights, or null: no norm
  bool rotated = true;
  HeadCache cache = HeadCache::None;
};
inline constexpr int kMaxHeadRows = 3;
// The KV cache the head sets store into (cache null: none name it).
struct HeadStore {
  const KvLayer* cache = nullptr;
  const int32_t* seq_ids = nullptr;
};
void norm_and_rope_heads(const HeadRows* rows, int n_rows, int n_tokens, int head_dim, float eps,
                         const int32_t* positions, const RopeConfig* rope, cudaStream_t stream,
                         const HeadStore& store = {});
// Whether the heads kernel can store heads of head_dim values into `cache`
// (a Q8_0 block must not straddle two heads); else kv_append stores them.
bool heads_can_store(const KvLayer& cache, int head_dim);

struct AttentionShape {
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  float scale = 0.0f;    // scores = Q·K × scale; 0: 1/sqrt(head_dim)
  float softcap = 0.0f;  // > 0: scores = softcap · tanh(scores / softcap), after the scale
  int window = 0;        // > 0: keys at p' with p - p' >= window are masked (sliding window)
};

// Whether the attention kernels take heads of this size: a multiple of 4 up
// to 256, of 8 beyond 128 (the decode kernel's 16-byte row pieces).
bool attention_head_dim_supported(int head_dim);

// Causal attention for n_tokens query vectors q ([n_tokens][n_head*head_dim]),
// token t of sequence seq_ids[t] attending to that sequence's cached
// positions 0..positions[t] (the last `window` of them when windowed), read
// through the sequence's block table. out
// has q's layout. Works for decode (one token per sequence) and prefill (many
// tokens of one sequence); GQA maps query head h to KV head h / (n_head /
// n_head_kv). CPU twin: cpu::attention (scaled and optionally soft-capped
// scores, softmax, weighted V, in FP32 from FP16 or Q8_0 K/V).
// `max_positions` bounds positions[t] + 1 over the batch (sizes scratch
// and the decode kernel's split of the context).
void attention(const KvLayer& cache, const AttentionShape& shape, const float* q, const int32_t* seq_ids,
               const int32_t* positions, int n_tokens, int max_positions, float* out, cudaStream_t stream);

// The decode kernel splits a context into parts of whole multiples of this
// many positions: a max_positions up to it is one part.
inline constexpr int kAttentionSplitGranule = 64;

// The same with the decode kernel at any token count (attention() takes it
// up to 32 tokens): for tokens that are each their sequence's only one, such
// as a decode step of many sequences, which the prefill kernel would take
// one sequence at a time.
void attention_decode(const KvLayer& cache, const AttentionShape& shape, const float* q, const int32_t* seq_ids,
                      const int32_t* positions, int n_tokens, int max_positions, float* out, cudaStream_t stream);

// y += x over n values (residual adds not fused into a product). CPU twin:
// cpu::add_in_place.
void add_in_place(float* y, const float* x, int64_t n, cudaStream_t stream);

}  // namespace m40::cuda
