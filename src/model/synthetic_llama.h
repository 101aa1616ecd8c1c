// Synthetic models: real GGUF files of any shape with seeded random weights
// stored as valid blocks of the chosen type. They let benchmarks run on 7B
// shapes without downloading anything. Each shape names its architecture
// (llama, qwen2, qwen3, qwen2moe, qwen3moe, gemma2, gemma3, phi3), and the file carries exactly
// the tensors and hyperparameter keys that llama.cpp's converter writes for
// that architecture, so llama.cpp loads it too.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gguf/file.h"

namespace m40::model {

struct SyntheticShape {
  std::string name;  // "llama2-7b", "qwen3-8b", "tiny", "tiny-gemma3", ... or "custom"
  uint32_t n_layer = 2;
  uint32_t n_embd = 256;
  uint32_t n_ff = 768;
  uint32_t n_head = 4;
  uint32_t n_head_kv = 2;
  uint32_t context_length = 512;
  float rope_freq_base = 10000.0f;
  float rms_eps = 1e-5f;

  std::string architecture = "llama";  // general.architecture
  // 0: n_embd / n_head. Otherwise the width of one head of Q, K and V, which
  // qwen3 and gemma write as attention.key_length / value_length (Q is then
  // n_head × head_dim wide, not n_embd).
  uint32_t head_dim = 0;
  bool tied_output = false;  // no output.weight: the head is token_embd
  // The keys below are written only when set (their architecture reads
  // them; llama.cpp has defaults for the absent ones).
  std::optional<uint32_t> sliding_window = std::nullopt;  // phi3 writes 0 for "none" (Phi-4)
  uint32_t sliding_window_pattern = 0;
  float attn_logit_softcapping = 0.0f;
  float final_logit_softcapping = 0.0f;
  float rope_scaling_linear_factor = 0.0f;  // rope.scaling.type "linear" and its factor
  uint32_t rope_original_context_length = 0;
  // Mixture-of-experts layers (0 experts: a dense FFN): a router
  // ffn_gate_inp [n_embd, n_expert] and ffn_{gate,up,down}_exps holding one
  // n_ff_expert-wide FFN per expert. llama (Mixtral) has no key for the
  // expert width, which is then n_ff; qwen3moe writes
  // expert_feed_forward_length and keeps feed_forward_length for the dense
  // intermediate size of its config.
  uint32_t n_expert = 0;
  uint32_t n_expert_used = 0;
  uint32_t n_ff_expert = 0;  // 0: n_ff
  // qwen2moe's shared expert (ffn_{gate,up,down}_shexp and its gate
  // ffn_gate_inp_shexp), written as expert_shared_feed_forward_length.
  uint32_t n_ff_shared_expert = 0;  // 0: n_ff

  uint32_t head_width() const { return head_dim != 0 ? head_dim : n_embd / n_head; }
  uint32_t expert_width() const { return n_ff_expert != 0 ? n_ff_expert : n_ff; }
  uint32_t shared_expert_width() const { return n_ff_shared_expert != 0 ? n_ff_shared_expert : n_ff; }
};

// The named shapes; nothing for an unknown name.
std::optional<SyntheticShape> synthetic_shape(const std::string& name);
std::vector<std::string> synthetic_shape_names();
// The architectures a shape may name.
std::vector<std::string> synthetic_architectures();

// The weight recipes, named as llama-quantize's file types: one type for every
// matrix but the output head ("f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0",
// "q5_1", "q5_k", "q6_k", "q3_k_s"), or llama.cpp's mixes that give some
// matrices more bits ("q2_k", "q3_k_m", "q3_k_l", "q4_k" (Q4_K_S), "q4_k_m",
// "iq4_nl", "iq4_xs"). Expert routers stay F32, as llama-quantize keeps them.
std::vector<std::string> synthetic_weight_recipes();

// One tensor of a synthetic model, as it will be stored.
struct SyntheticTensor {
  std::string name;
  gguf::TensorType type;
  std::vector<uint64_t> dims;  // ggml order: dims[0] is the row length
  float mean;                  // of the drawn values
  float stddev;
};

struct SyntheticPlan {
  std::vector<SyntheticTensor> tensors;  // in file order
  uint64_t parameter_count = 0;
  uint64_t tensor_bytes = 0;  // the tensors' data, without the header and alignment padding
  std::vector<std::string> notes;  // e.g. tensors that fell back to another type
};

// The tensors a model of `shape` with `recipe` weights and `n_vocab` tokens
// holds, without writing anything. Throws m40::Error on a bad shape or an
// unknown recipe.
SyntheticPlan plan_synthetic_model(const SyntheticShape& shape, const std::string& recipe, uint64_t n_vocab);

struct SyntheticOptions {
  SyntheticShape shape;
  std::string recipe = "q4_k_m";
  uint64_t seed = 1234;
  unsigned threads = 0;  // 0: every core
  // The tokenizer.* metadata is copied from this file; the vocabulary size
  // is that tokenizer's.
  const gguf::File* tokenizer_source = nullptr;
};

struct SyntheticReport {
  uint64_t parameter_count = 0;
  uint64_t file_bytes = 0;
  std::vector<std::string> notes;  // e.g. tensors that fell back to another type
};

// Writes the model to `path` (atomically). Throws m40::Error on a bad shape,
// an unknown recipe, a missing tokenizer or an I/O failure.
SyntheticReport write_synthetic_llama(const SyntheticOptions& options, const std::string& path);

}  // namespace m40::model
