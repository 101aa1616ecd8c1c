// Hyperparameters of a model, read from GGUF metadata under the
// architecture's key prefix (`llama.block_count`, `qwen2.block_count`, ...),
// with the architecture description's features resolved into values the
// forward pass applies (scales, soft-caps, sliding-window layers, RoPE per
// layer). The backends read these, never the architecture's name.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/metadata.h"
#include "model/architecture.h"

namespace m40::gguf {
class File;
struct TensorInfo;
}  // namespace m40::gguf

namespace m40::model {

// `{arch}.rope.scaling.type`, named as llama.cpp writes it.
enum class RopeScaling { None, Linear, Yarn, LongRope };
std::string_view rope_scaling_name(RopeScaling scaling);
std::optional<RopeScaling> rope_scaling_from_name(std::string_view name);

// `{arch}.pooling_type`, llama.cpp's enum llama_pooling_type: how an
// embedding model turns its tokens' hidden states into one vector.
enum class PoolingType : uint32_t { None = 0, Mean = 1, Cls = 2, Last = 3, Rank = 4 };
std::string_view pooling_type_name(PoolingType pooling);  // "none", "mean", "cls", "last", "rank"

// RoPE as one layer applies it (ggml's rope_ext with YaRN): for rotary pair
// i, theta_extrap = pos * freq_base^(-2i/n_rot) / factor_i (factor_i from a
// rope factors tensor, else 1), theta_interp = freq_scale * theta_extrap;
// with ext_factor != 0 the two are mixed by YaRN's ramp (extrapolated below
// pair corr_low, interpolated above corr_high). cos and sin are multiplied
// by magnitude.
struct RopeSettings {
  bool enabled = true;      // false: the layer applies no RoPE (smollm3's NoPE layers)
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;  // 1 / the scaling factor (linear and YaRN)
  float ext_factor = 0.0f;  // 1 with YaRN
  float corr_low = 0.0f;
  float corr_high = 0.0f;
  float magnitude = 1.0f;   // YaRN's mscale, LongRoPE's attn_factor
};

// Hyperparameters that are missing, mistyped or inconsistent; the message
// names the metadata key (or the architecture, when that is unknown).
class HparamsError : public gguf::MetadataError {
 public:
  using gguf::MetadataError::MetadataError;
};

// The metadata key `{architecture}.{suffix}`.
std::string arch_key(std::string_view architecture, std::string_view suffix);

struct ModelHparams {
  std::string architecture;  // `general.architecture`
  const Architecture* desc = nullptr;

  uint32_t n_layer = 0;       // {arch}.block_count
  uint32_t n_embd = 0;        // {arch}.embedding_length
  uint32_t n_ff = 0;          // {arch}.feed_forward_length
  uint32_t n_head = 0;        // {arch}.attention.head_count
  uint32_t n_head_kv = 0;     // {arch}.attention.head_count_kv (default: n_head)
  uint32_t n_embd_head = 0;   // {arch}.attention.key_length (default: n_embd / n_head)
  uint32_t n_rot = 0;         // {arch}.rope.dimension_count (default: n_embd_head)
  uint32_t n_ctx_train = 0;   // {arch}.context_length
  uint32_t n_vocab = 0;       // {arch}.vocab_size, else tokenizer.ggml.tokens, else token_embd
  // Mixture-of-experts layers (0 experts: a dense FFN). Each token's FFN is
  // the weighted sum of n_expert_used of n_expert expert FFNs, each n_ff_expert wide.
  uint32_t n_expert = 0;       // {arch}.expert_count
  uint32_t n_expert_used = 0;  // {arch}.expert_used_count
  uint32_t n_ff_expert = 0;    // {arch}.expert_feed_forward_length (qwen3moe; default n_ff / n_expert_used), llama: n_ff
  uint32_t n_ff_shared_expert = 0;  // {arch}.expert_shared_feed_forward_length (default n_ff); 0: no shared expert
  float rms_eps = 0.0f;       // {arch}.attention.layer_norm_rms_epsilon

  // RoPE as the file describes it ...
  float rope_freq_base = 10000.0f;               // {arch}.rope.freq_base
  RopeScaling rope_scaling = RopeScaling::None;  // {arch}.rope.scaling.type
  float rope_scaling_factor = 1.0f;              // {arch}.rope.scaling.factor
  uint32_t rope_scaling_orig_ctx = 0;  // {arch}.rope.scaling.original_context_length (default n_ctx_train)
  float rope_attn_factor = 1.0f;       // {arch}.rope.scaling.attn_factor (LongRoPE)
  float yarn_beta_fast = 32.0f;        // {arch}.rope.scaling.yarn_beta_fast (read by mistral3)
  float yarn_beta_slow = 1.0f;         // {arch}.rope.scaling.yarn_beta_slow (read by mistral3)
  float yarn_log_multiplier = 0.0f;    // {arch}.rope.scaling.yarn_log_multiplier (read by mistral3)
  // ... and as the layers apply it: global layers, and sliding-window ones.
  RopeSettings rope_global;
  RopeSettings rope_local;

  // Sliding-window attention: in the layers swa_layers marks, a query at
  // position p sees keys at p' with p - p' < sliding_window.
  uint32_t sliding_window = 0;
  std::vector<uint8_t> swa_layers;   // per layer: 1 = windowed
  std::vector<uint8_t> rope_layers;  // per layer: 1 = applies RoPE

  // Scales and caps (a scale of 1 or a cap of 0 is off).
  float embedding_scale = 1.0f;  // inputs × this (gemma: √n_embd; granite: embedding_scale)
  float attention_scale = 1.0f;  // scores = Q·K × this (1/√head_dim unless the architecture says otherwise)
  float attn_softcap = 0.0f;     // scores = cap · tanh(scores / cap) (gemma2)
  float residual_scale = 1.0f;   // each branch's output × this before the residual add (granite)
  float logit_scale = 1.0f;      // logits × this (granite: 1 / logit_scale)
  float final_softcap = 0.0f;    // logits = cap · tanh(logits / cap) (gemma2)
  float attn_temperature_scale = 0.0f;   // Q × 1 + this · ln(⌊p / L⌋ + 1) (mistral3) ...
  uint32_t attn_temperature_length = 0;  // ... with L = this

  // {arch}.pooling_type: set in embedding models' files (Qwen3-Embedding:
  // last), absent in generative ones. A file that sets it is an embedding
  // model, as llama.cpp's converter and Ollama read it.
  std::optional<PoolingType> pooling;
  bool is_embedding_model() const { return pooling.has_value(); }

  bool has_experts() const { return n_expert > 0; }
  uint32_t head_dim() const { return n_embd_head; }
  uint32_t n_gqa() const { return n_head / n_head_kv; }  // query heads per KV head
  // from_metadata bounds both products, so they fit in 32 bits.
  uint32_t q_dim() const { return n_head * n_embd_head; }
  uint32_t kv_dim() const { return n_head_kv * n_embd_head; }
  RopeStyle rope_style() const { return desc->rope_style; }
  bool is_swa_layer(uint32_t layer) const { return swa_layers[layer] != 0; }
  // The window of a layer's attention (0: none).
  uint32_t window_of_layer(uint32_t layer) const { return is_swa_layer(layer) ? sliding_window : 0; }
  // RoPE of one layer (enabled = false where it applies none).
  RopeSettings rope_for_layer(uint32_t layer) const;
  // LongRoPE uses rope_factors_long when the context is longer than the
  // original trained context, else rope_factors_short (chosen per context).
  bool use_long_rope_factors(uint32_t n_ctx) const { return n_ctx > rope_scaling_orig_ctx; }
  // Q × this for the token at `position` (1 without temperature scaling).
  float attention_temperature(int32_t position) const;

  // Reads and checks the hyperparameters. `token_embd` (optional) gives the
  // vocabulary size when neither {arch}.vocab_size nor tokenizer.ggml.tokens
  // does. Throws HparamsError naming the key that is missing, mistyped or
  // inconsistent, or the architecture when it is unknown.
  static ModelHparams from_metadata(const gguf::Metadata& metadata, const gguf::TensorInfo* token_embd = nullptr);
  static ModelHparams from_file(const gguf::File& file);
};

}  // namespace m40::model
