// The named weight tensors of a llama-family model, as views into the GGUF
// mapping (nothing copied), with every shape checked against the
// hyperparameters before any computation.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gguf/file.h"
#include "model/llama_hparams.h"

namespace m40::model {

// A 2-D weight matrix (or a 1-D vector with rows = 1), stored in its GGUF type.
// Row r holds `cols` values at data + r * row_bytes.
struct WeightView {
  std::string name;
  gguf::TensorType type = gguf::TensorType::F32;
  uint64_t cols = 0;
  uint64_t rows = 0;
  uint64_t row_bytes = 0;
  const uint8_t* data = nullptr;

  const uint8_t* row(uint64_t r) const { return data + r * row_bytes; }
  bool present() const { return data != nullptr; }
};

struct LayerWeights {
  WeightView attn_norm;  // [n_embd]
  WeightView wq;         // [n_embd -> q_dim]
  WeightView wk;         // [n_embd -> kv_dim]
  WeightView wv;         // [n_embd -> kv_dim]
  WeightView bq, bk, bv; // optional biases (qwen2)
  WeightView wo;         // [q_dim -> n_embd]
  WeightView ffn_norm;   // [n_embd]
  WeightView w_gate;     // [n_embd -> n_ff]
  WeightView w_up;       // [n_embd -> n_ff]
  WeightView w_down;     // [n_ff -> n_embd]
};

struct LlamaWeights {
  WeightView token_embd;   // [n_embd x n_vocab]
  WeightView output_norm;  // [n_embd]
  WeightView output;       // [n_embd -> n_vocab]; token_embd when tied
  bool tied_output = false;
  WeightView rope_freqs;   // optional per-pair frequency divisors (Llama 3.1), [n_rot / 2]
  std::vector<LayerWeights> layers;

  // Finds and checks every tensor. Throws m40::Error naming a missing tensor,
  // a wrong shape (expected vs found) or a type the engine cannot compute with.
  static LlamaWeights load(const gguf::File& file, const LlamaHparams& hparams);

  uint64_t total_bytes() const;
};

}  // namespace m40::model
