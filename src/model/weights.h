// The named weight tensors of a model, as views into the GGUF mapping
// (nothing copied), with every shape checked against the hyperparameters
// before any computation. The architecture description says which tensors
// a layer carries; fused tensors (attn_qkv, phi3's gate/up ffn_up) become
// views of their row ranges, so the backends see one layout.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gguf/file.h"
#include "model/hparams.h"

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
  WeightView attn_norm;       // [n_embd]
  WeightView wq;              // [n_embd -> q_dim]
  WeightView wk;              // [n_embd -> kv_dim]
  WeightView wv;              // [n_embd -> kv_dim]
  WeightView bq, bk, bv;      // optional biases (qwen2; any file that has them)
  WeightView q_norm, k_norm;  // [head_dim], per-head RMSNorm before RoPE (qwen3, gemma3)
  WeightView wo;              // [q_dim -> n_embd]
  WeightView bo;              // optional attn_output bias [n_embd]
  WeightView post_attn_norm;  // [n_embd], RMSNorm of the attention branch (gemma)
  WeightView ffn_norm;        // [n_embd]
  WeightView w_gate;          // [n_embd -> n_ff]
  WeightView w_up;            // [n_embd -> n_ff]
  WeightView w_down;          // [n_ff -> n_embd]
  WeightView post_ffn_norm;   // [n_embd], RMSNorm of the FFN branch (gemma)

  // Mixture-of-experts layers (hparams.n_expert > 0) instead of w_gate/w_up/w_down:
  WeightView ffn_gate_inp;                // router [n_embd -> n_expert]
  std::vector<WeightView> gate_exps;      // per expert: [n_embd -> n_ff_expert], slices of ffn_gate_exps
  std::vector<WeightView> up_exps;        // per expert: [n_embd -> n_ff_expert], slices of ffn_up_exps
  std::vector<WeightView> down_exps;      // per expert: [n_ff_expert -> n_embd], slices of ffn_down_exps
  // The shared expert (qwen2moe), beside the routed ones:
  WeightView gate_inp_shexp;  // its gate [n_embd -> 1]: output × sigmoid(gate · x)
  WeightView gate_shexp;      // [n_embd -> n_ff_shared_expert]
  WeightView up_shexp;        // [n_embd -> n_ff_shared_expert]
  WeightView down_shexp;      // [n_ff_shared_expert -> n_embd]
  bool has_experts() const { return ffn_gate_inp.present(); }
  bool has_shared_expert() const { return gate_inp_shexp.present(); }
};

// The slices of a 3-D tensor (an expert tensor: gate_exps, up_exps,
// down_exps) as one matrix of all their rows, slice e's first row at row
// e * slices[0].rows; an absent view for no slices. Throws m40::Error if the
// slices are not back to back in one type and shape.
WeightView stacked_slices(const std::vector<WeightView>& slices);

// Rows [first, first + count) of a matrix, as a matrix of their own (a
// fused tensor's parts are back to back, row after row).
WeightView row_range(const WeightView& w, uint64_t first, uint64_t count, const std::string& part);

// Elements [first, first + count) of a vector stored one value per element
// (F32 or F16). Throws m40::Error for a block-quantized vector.
WeightView element_range(const WeightView& w, uint64_t first, uint64_t count, const std::string& part);

struct ModelWeights {
  WeightView token_embd;   // [n_embd x n_vocab]
  WeightView output_norm;  // [n_embd]
  WeightView output;       // [n_embd -> n_vocab]; token_embd when tied
  bool tied_output = false;
  // Per-pair frequency divisors, [n_rot / 2], all optional: Llama 3.1's
  // rope_freqs, or LongRoPE's short and long factors (Phi-3).
  WeightView rope_freqs;
  WeightView rope_factors_short;
  WeightView rope_factors_long;
  std::vector<LayerWeights> layers;
  // Tensors of the file the forward pass does not read (a multimodal file's
  // vision tower, gemma2's output.weight beside its tied head, ...).
  std::vector<std::string> unused_tensors;

  // Finds and checks every tensor. Throws m40::Error naming a missing tensor,
  // a wrong shape (expected vs found), a type the engine cannot compute with,
  // or a feature it does not implement.
  static ModelWeights load(const gguf::File& file, const ModelHparams& hparams);

  // The frequency divisors RoPE applies at a context of n_ctx positions
  // (rope_freqs, else LongRoPE's long or short factors), or null.
  const WeightView* rope_factors(const ModelHparams& hparams, uint32_t n_ctx) const;

  uint64_t total_bytes() const;
  // The bytes of one layer's tensors.
  uint64_t layer_bytes(size_t layer) const;
  // What a stage that computes layers [first, end) reads: those layers, the
  // input side (token_embd, the RoPE factors) where it begins at layer 0,
  // the output side (output_norm and the head, token_embd when tied) where
  // it ends at the last layer. stage_bytes(0, layers.size()) == total_bytes().
  uint64_t stage_bytes(size_t first, size_t end) const;
  // Whether the layers route tokens to experts (a backend without MoE support refuses these).
  bool has_experts() const { return !layers.empty() && layers[0].has_experts(); }
  bool has_shared_expert() const { return !layers.empty() && layers[0].has_shared_expert(); }
};

}  // namespace m40::model
