// What `m40-llm show` reports about a GGUF file, computed once from the file:
// identity, size, hyperparameters, tokenizer and tensor types. It never fails
// on a readable file: hyperparameters and tokenizer facts that a file lacks
// (vocabulary-only files, other architectures) are simply left empty.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/metadata.h"
#include "gguf/tensor_type.h"

namespace m40::gguf {
class File;
}

namespace m40::model {

// llama.cpp's `general.file_type` names (enum llama_ftype: ALL_F32,
// MOSTLY_F16, MOSTLY_Q4_K_M, ...), with " (guessed)" when the GUESSED bit is
// set; nothing for an id llama.cpp does not define.
std::optional<std::string> file_type_name(uint32_t file_type);

// 656.0K, 6.74B: K and M with one decimal, B and T with two, as model sizes
// are usually quoted.
std::string format_parameter_count(uint64_t count);
// 732.16 KiB, 6.74 GiB (binary units, two decimals); bytes below 1 KiB.
std::string format_bytes(uint64_t bytes);
// The shortest text that reads back as the same double (1e-06, 10000, 0.5).
std::string format_float(double value);
// A metadata float as a double; FLOAT32 values become the double of their
// shortest decimal form, so 1e-6f reads 1e-06, not 9.99999997e-07.
std::optional<double> metadata_float(const gguf::Value& value);
// A metadata value for one line of output: strings quoted, escaped
// (control characters as \n, \t, \xNN) and cut after `max_string_bytes`;
// arrays cut after `max_items` with their length given.
std::string format_metadata_value(const gguf::Value& value, size_t max_items = 8,
                                  size_t max_string_bytes = 80);
// Escapes control characters of token text for display (no quotes added).
std::string escape_for_display(std::string_view text, size_t max_bytes = SIZE_MAX);

struct SpecialToken {
  std::string_view label;               // "BOS", "EOS", ...
  std::string_view key;                 // tokenizer.ggml.bos_token_id, ...
  int64_t id = -1;
  std::optional<std::string> text;      // the token's text, when the id is in the vocabulary
};

struct TensorTypeStats {
  gguf::TensorType type;
  size_t count = 0;
  uint64_t elements = 0;
  uint64_t bytes = 0;
};

struct ModelSummary {
  // The file.
  std::string path;
  uint64_t file_size = 0;  // all parts of a split model
  uint32_t gguf_version = 0;
  uint32_t alignment = 0;
  uint64_t data_offset = 0;
  size_t metadata_count = 0;
  size_t tensor_count = 0;

  // The model.
  std::string architecture;              // empty when general.architecture is absent
  bool architecture_known = false;       // an architecture m40-llm has a description of
  bool architecture_runnable = false;    // this file loads for m40-llm's forward pass
  std::string not_runnable_reason;       // why it does not (the loader's own error), when it does not
  std::vector<std::string> unused_tensors;  // tensors a runnable file holds that the forward pass does not read
  std::optional<std::string> name;       // general.name
  std::optional<std::string> license;    // general.license
  std::optional<std::string> size_label; // general.size_label
  uint64_t parameter_count = 0;          // sum of the tensors' element counts
  uint64_t tensor_bytes = 0;             // sum of the tensors' byte sizes
  std::optional<uint32_t> file_type;     // general.file_type
  std::optional<uint32_t> quantization_version;  // general.quantization_version
  std::vector<TensorTypeStats> tensor_types;     // most elements first
  std::optional<double> bits_per_weight() const;

  // Architecture hyperparameters, as far as the file gives them ({arch}.*).
  std::optional<uint64_t> context_length;
  std::optional<uint64_t> embedding_length;
  std::optional<uint64_t> block_count;
  std::optional<uint64_t> feed_forward_length;
  std::optional<uint64_t> head_count;
  std::optional<uint64_t> head_count_kv;
  std::optional<uint64_t> head_dim;      // attention.key_length, else embedding_length / head_count
  std::optional<uint64_t> rope_dimension_count;
  std::optional<double> rope_freq_base;
  std::optional<std::string> rope_scaling_type;
  std::optional<double> rope_scaling_factor;
  std::optional<uint64_t> rope_scaling_original_context_length;
  std::optional<double> rms_norm_eps;    // attention.layer_norm_rms_epsilon
  std::optional<double> layer_norm_eps;  // attention.layer_norm_epsilon (bert, falcon, gpt2, ...)
  std::optional<uint64_t> vocab_size;    // {arch}.vocab_size, else token count, else token_embd
  std::optional<bool> output_tied;       // no output.weight (only for files with tensors)
  // {arch}.pooling_type (llama.cpp's enum: 0 none, 1 mean, 2 cls, 3 last,
  // 4 rank); a file that sets it is an embedding model.
  std::optional<uint64_t> pooling_type;
  bool embedding_model() const { return pooling_type.has_value(); }
  // Mixture-of-experts layers ({arch}.expert_count > 0).
  std::optional<uint64_t> expert_count;               // {arch}.expert_count
  std::optional<uint64_t> expert_used_count;          // {arch}.expert_used_count: experts each token runs
  std::optional<uint64_t> expert_feed_forward_length; // one expert's FFN width (as the loader resolves it when it loads)
  std::optional<uint64_t> shared_expert_feed_forward_length;  // the shared expert's FFN width (qwen2moe)
  // Parameters one token computes with: every tensor, but of the 3-D expert
  // tensors (*_exps) only expert_used_count of expert_count slices.
  std::optional<uint64_t> active_parameter_count;
  bool has_experts() const { return expert_count.value_or(0) > 0; }
  // Bytes of weights one decode step reads per token (only for files with
  // tensors): every tensor, but one row of token_embd when the output head
  // is a tensor of its own, and of the expert tensors expert_used_count of
  // expert_count slices. Bandwidth over it bounds the decode speed.
  std::optional<uint64_t> decode_bytes_per_token;

  // Tokenizer.
  std::optional<std::string> tokenizer_model;  // tokenizer.ggml.model
  std::optional<std::string> tokenizer_pre;    // tokenizer.ggml.pre
  std::optional<uint64_t> token_count;         // length of tokenizer.ggml.tokens
  std::optional<uint64_t> merge_count;         // length of tokenizer.ggml.merges
  std::vector<SpecialToken> special_tokens;    // only those the file sets
  std::optional<bool> add_bos;
  std::optional<bool> add_eos;
  bool has_chat_template = false;
  uint64_t chat_template_bytes = 0;

  const SpecialToken* special_token(std::string_view label) const;
};

ModelSummary summarize(const gguf::File& file);

// "SentencePiece" for llama, "BPE" for gpt2, ...; empty for a model we do not name.
std::string_view tokenizer_kind(std::string_view tokenizer_model);

}  // namespace m40::model
