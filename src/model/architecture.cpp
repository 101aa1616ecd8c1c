#include "model/architecture.h"

#include <string>

namespace m40::model {

namespace {

// One description per architecture. Fields left out are off (false, 0, "").
constexpr Architecture kArchitectures[] = {
    // Llama 1-3.x, Mistral 7B / Nemo, SmolLM2, DeepSeek-R1-Distill-Llama
    // (and Mixtral: experts when expert_count > 0).
    {.name = "llama", .rope_style = RopeStyle::Normal, .activation = FfnActivation::Silu},
    // Qwen2, Qwen2.5, QwQ, DeepSeek-R1-Distill-Qwen.
    {.name = "qwen2", .rope_style = RopeStyle::NeoX, .activation = FfnActivation::Silu, .qkv_bias = true},
    // Qwen3 dense.
    {.name = "qwen3", .rope_style = RopeStyle::NeoX, .activation = FfnActivation::Silu, .qk_norm = true},
    // Qwen1.5-MoE, Qwen2-MoE (57B-A14B): routed experts without
    // renormalization plus a sigmoid-gated shared expert.
    {.name = "qwen2moe",
     .rope_style = RopeStyle::NeoX,
     .activation = FfnActivation::Silu,
     .experts_required = true,
     .reads_expert_ff_length = true,
     .expert_weights_renormalized = false,
     .shared_expert = true},
    {.name = "qwen3moe",
     .rope_style = RopeStyle::NeoX,
     .activation = FfnActivation::Silu,
     .qk_norm = true,
     .experts_required = true,
     .reads_expert_ff_length = true},
    {.name = "gemma2",
     .rope_style = RopeStyle::NeoX,
     .activation = FfnActivation::GeluTanh,
     .post_norms = true,
     .output_always_tied = true,
     .embedding_scale_sqrt_n_embd = true,
     .gemma_attention_scale = true,
     .attention_softcap = true,
     .default_final_softcap = 30.0f,
     .reads_final_softcap = true,
     .sliding_window = SlidingWindow::Gemma2},
    // Gemma 3 text layers; a multimodal file's vision tower is not read.
    {.name = "gemma3",
     .rope_style = RopeStyle::NeoX,
     .activation = FfnActivation::GeluTanh,
     .qk_norm = true,
     .post_norms = true,
     .embedding_scale_sqrt_n_embd = true,
     .gemma_attention_scale = true,
     .reads_final_softcap = true,
     .sliding_window = SlidingWindow::Gemma3},
    // Phi-3, 3.5, 4 (fused attn_qkv and gate/up; LongRoPE factors). llama.cpp
    // ignores phi3.attention.sliding_window, and so does m40-llm.
    {.name = "phi3", .rope_style = RopeStyle::NeoX, .activation = FfnActivation::Silu, .fused_gate_up = true},
    // Mistral Small 3.x, Ministral 3 (text): YaRN and attention temperature.
    {.name = "mistral3",
     .rope_style = RopeStyle::Normal,
     .activation = FfnActivation::Silu,
     .yarn_keys = true,
     .attention_temperature = true},
    // Granite 3.x dense.
    {.name = "granite",
     .rope_style = RopeStyle::Normal,
     .activation = FfnActivation::Silu,
     .granite_multipliers = true,
     .rope_switch = true},
    {.name = "smollm3", .rope_style = RopeStyle::Normal, .activation = FfnActivation::Silu, .no_rope_layer_step = 4},
};

std::string make_list() {
  std::string list;
  for (const auto& a : kArchitectures) {
    if (!list.empty()) list += ", ";
    list += a.name;
  }
  return list;
}

}  // namespace

std::string_view rope_style_name(RopeStyle style) { return style == RopeStyle::Normal ? "normal" : "neox"; }

std::string_view ffn_activation_name(FfnActivation activation) {
  return activation == FfnActivation::Silu ? "silu" : "gelu";
}

std::span<const Architecture> known_architectures() { return kArchitectures; }

const Architecture* find_architecture(std::string_view name) {
  for (const auto& a : kArchitectures) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

std::string_view known_architecture_list() {
  static const std::string list = make_list();
  return list;
}

}  // namespace m40::model
