// Hyperparameters of a llama-family model, read from GGUF metadata under the
// architecture's key prefix (`llama.block_count`, `qwen2.block_count`, ...).
// Architecture differences live in a small table of data, not in switches:
// the same reader serves every architecture that shares the llama layout.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "gguf/metadata.h"

namespace m40::gguf {
class File;
struct TensorInfo;
}  // namespace m40::gguf

namespace m40::model {

// How RoPE pairs the dimensions of a head: Normal rotates adjacent pairs
// (0,1),(2,3)... as llama.cpp's converter lays out llama Q/K rows; NeoX
// rotates pairs half a rotary width apart (0,d/2),(1,d/2+1)...
enum class RopeStyle { Normal, NeoX };
std::string_view rope_style_name(RopeStyle style);

// `{arch}.rope.scaling.type`, named as llama.cpp writes it.
enum class RopeScaling { None, Linear, Yarn, LongRope };
std::string_view rope_scaling_name(RopeScaling scaling);
std::optional<RopeScaling> rope_scaling_from_name(std::string_view name);

// What differs between the llama-family architectures m40-llm knows.
struct ArchitectureTraits {
  std::string_view name;    // `general.architecture`
  RopeStyle rope_style;
  bool attention_qkv_bias;  // the Q, K and V projections carry bias vectors
  bool attention_qk_norm;   // per-head RMSNorm on Q and K before RoPE
  bool runnable;            // m40-llm's forward pass implements it
};

// The llama-family architectures whose hyperparameters LlamaHparams reads.
std::span<const ArchitectureTraits> known_architectures();
const ArchitectureTraits* find_architecture(std::string_view name);

// Hyperparameters that are missing, mistyped or inconsistent; the message
// names the metadata key (or the architecture, when that is unknown).
class HparamsError : public gguf::MetadataError {
 public:
  using gguf::MetadataError::MetadataError;
};

// The metadata key `{architecture}.{suffix}`.
std::string arch_key(std::string_view architecture, std::string_view suffix);

struct LlamaHparams {
  std::string architecture;  // `general.architecture`
  const ArchitectureTraits* traits = nullptr;

  uint32_t n_layer = 0;       // {arch}.block_count
  uint32_t n_embd = 0;        // {arch}.embedding_length
  uint32_t n_ff = 0;          // {arch}.feed_forward_length
  uint32_t n_head = 0;        // {arch}.attention.head_count
  uint32_t n_head_kv = 0;     // {arch}.attention.head_count_kv (default: n_head)
  uint32_t n_embd_head = 0;   // {arch}.attention.key_length (default: n_embd / n_head)
  uint32_t n_rot = 0;         // {arch}.rope.dimension_count (default: n_embd_head)
  uint32_t n_ctx_train = 0;   // {arch}.context_length
  uint32_t n_vocab = 0;       // {arch}.vocab_size, else tokenizer.ggml.tokens, else token_embd
  float rope_freq_base = 10000.0f;               // {arch}.rope.freq_base
  RopeScaling rope_scaling = RopeScaling::None;  // {arch}.rope.scaling.type
  float rope_scaling_factor = 1.0f;              // {arch}.rope.scaling.factor
  uint32_t rope_scaling_orig_ctx = 0;            // {arch}.rope.scaling.original_context_length
  float rms_eps = 0.0f;                          // {arch}.attention.layer_norm_rms_epsilon

  uint32_t head_dim() const { return n_embd_head; }
  uint32_t n_gqa() const { return n_head / n_head_kv; }  // query heads per KV head
  // from_metadata bounds both products, so they fit in 32 bits.
  uint32_t q_dim() const { return n_head * n_embd_head; }
  uint32_t kv_dim() const { return n_head_kv * n_embd_head; }
  RopeStyle rope_style() const { return traits->rope_style; }

  // Reads and checks the hyperparameters. `token_embd` (optional) gives the
  // vocabulary size when neither {arch}.vocab_size nor tokenizer.ggml.tokens
  // does. Throws HparamsError naming the key that is missing, mistyped or
  // inconsistent, or the architecture when it is not a known llama-family one.
  static LlamaHparams from_metadata(const gguf::Metadata& metadata,
                                    const gguf::TensorInfo* token_embd = nullptr);
  static LlamaHparams from_file(const gguf::File& file);
};

}  // namespace m40::model
