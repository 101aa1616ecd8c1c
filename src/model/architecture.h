// The architecture layer: one small description per GGUF architecture
// (`general.architecture`), as llama.cpp @ 3f545be defines it in
// src/llama-arch.cpp, src/llama-model.cpp and src/models/<arch>.cpp.
//
// A description says which tensors the layers carry and which features the
// one forward pass of each backend must apply (RoPE style, per-head Q/K
// norms, post-norms, GELU or SiLU gate, soft-caps, sliding windows, the
// Granite multipliers, ...). ModelHparams resolves the metadata-dependent
// values (window length, RoPE scaling, scales) against it, and ModelWeights
// finds the tensors it names. Adding an architecture is a new row in
// architecture.cpp plus its tests; the backends follow the features.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace m40::model {

// How RoPE pairs the dimensions of a head: Normal rotates adjacent pairs
// (0,1),(2,3)... as llama.cpp's converter lays out llama Q/K rows; NeoX
// rotates pairs half a rotary width apart (0,d/2),(1,d/2+1)...
enum class RopeStyle { Normal, NeoX };
std::string_view rope_style_name(RopeStyle style);

// The gated FFN's activation: down(act(gate · x) ⊙ up · x).
enum class FfnActivation { Silu, GeluTanh };
std::string_view ffn_activation_name(FfnActivation activation);

// Which layers attend through a sliding window and how long it is.
enum class SlidingWindow {
  None,
  // Always on (gemma2): attention.sliding_window (default 4096), layer il
  // local iff il % P < P - 1 with P = attention.sliding_window_pattern
  // (default 2); local layers use rope.freq_base_swa (default: the global
  // base) and the global RoPE scaling.
  Gemma2,
  // Only when attention.sliding_window > 0 (gemma3): pattern default 6;
  // local layers use rope.freq_base_swa (default 10000) and no scaling.
  Gemma3,
};

struct Architecture {
  std::string_view name;  // general.architecture
  RopeStyle rope_style = RopeStyle::Normal;
  FfnActivation activation = FfnActivation::Silu;

  // Tensors the layers carry besides the llama set (attn_q/k/v may be one
  // attn_qkv in any architecture, and Q/K/V biases are used where present,
  // as llama.cpp's create_tensor_qkv does).
  bool qkv_bias = false;         // attn_q/k/v.bias required (qwen2)
  bool qk_norm = false;          // attn_q_norm / attn_k_norm [head_dim]: per-head RMSNorm before RoPE
  bool post_norms = false;       // post_attention_norm / post_ffw_norm on each branch's output (gemma)
  bool fused_gate_up = false;    // ffn_up [n_embd, 2 n_ff] holds the gate rows then the up rows; no ffn_gate (phi3)
  bool output_always_tied = false;  // the head is token_embd even when output.weight exists (gemma2)

  // Features read from metadata under the architecture's prefix.
  bool embedding_scale_sqrt_n_embd = false;  // inputs × √n_embd (gemma)
  bool gemma_attention_scale = false;  // 1/√key_length, or 1/√(n_embd/n_head) for the 27B layouts (46/62 layers)
  bool granite_multipliers = false;    // embedding_scale, residual_scale, attention.scale, logit_scale
  bool attention_softcap = false;      // attn_logit_softcapping (default 50) on the scores (gemma2)
  float default_final_softcap = 0.0f; // final_logit_softcapping when the key is absent (0: off)
  bool reads_final_softcap = false;    // final_logit_softcapping is read at all
  SlidingWindow sliding_window = SlidingWindow::None;
  bool yarn_keys = false;              // rope.scaling.yarn_beta_fast/slow, yarn_log_multiplier (mistral3)
  bool attention_temperature = false;  // attention.temperature_scale: Q × 1 + τ ln(⌊p / L⌋ + 1) (mistral3)
  bool rope_switch = false;            // rope.scaling.finetuned (default true) turns RoPE off in every layer (granite)
  uint32_t no_rope_layer_step = 0; // layers with (il + 1) % step == 0 apply no RoPE (smollm3: 4); 0: none

  // Mixture-of-experts FFN (ffn_gate_inp router, ffn_{gate,up,down}_exps):
  // in every architecture when expert_count > 0 (llama: Mixtral), required
  // here. Routing as llama.cpp's build_moe_ffn with softmax gating over all
  // experts and the top expert_used_count chosen.
  bool experts_required = false;
  bool reads_expert_ff_length = false;  // expert_feed_forward_length (default n_ff / expert_used_count); else n_ff
  // The chosen experts' probabilities are renormalized to sum 1 (qwen3moe,
  // llama); otherwise they are the softmax's own (qwen2moe).
  bool expert_weights_renormalized = true;
  // A shared expert beside the routed ones (qwen2moe): every token also
  // passes ffn_{gate,up,down}_shexp (expert_shared_feed_forward_length wide,
  // default n_ff), scaled by sigmoid(ffn_gate_inp_shexp · x).
  bool shared_expert = false;

  // Why m40-llm cannot run it yet; empty when it can.
  std::string_view not_runnable = {};

  bool runnable() const { return not_runnable.empty(); }
};

// Every architecture m40-llm knows, runnable or not.
std::span<const Architecture> known_architectures();
const Architecture* find_architecture(std::string_view name);
// "llama, qwen2, ..." for messages.
std::string_view known_architecture_list();

}  // namespace m40::model
