#include "model/synthetic_llama.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string_view>

#include "common/error.h"
#include "common/parallel_for.h"
#include "gguf/writer.h"
#include "quant/quantize.h"

namespace m40::model {

using gguf::TensorType;

namespace {

// Named shapes from the published model configurations (config.json of each
// model; for gemma3-12b its text_config). The tiny-<arch> shapes have the
// dimensions and hyperparameters of the llama.cpp-written test models in
// models/arch/ (windows of 8 tokens and a soft-cap of 5, so that short test
// prompts exercise them), except tiny-phi3, which is a small Phi-4: no
// LongRoPE factors, an output head of its own.
const std::map<std::string, SyntheticShape>& shapes() {
  static const std::map<std::string, SyntheticShape> table = [] {
    const SyntheticShape list[] = {
        {.name = "tiny", .n_layer = 2, .n_embd = 256, .n_ff = 768, .n_head = 4, .n_head_kv = 2,
         .context_length = 512, .rope_freq_base = 10000.0f, .rms_eps = 1e-5f},
        {.name = "llama2-7b", .n_layer = 32, .n_embd = 4096, .n_ff = 11008, .n_head = 32, .n_head_kv = 32,
         .context_length = 4096, .rope_freq_base = 10000.0f, .rms_eps = 1e-5f},
        {.name = "llama2-13b", .n_layer = 40, .n_embd = 5120, .n_ff = 13824, .n_head = 40, .n_head_kv = 40,
         .context_length = 4096, .rope_freq_base = 10000.0f, .rms_eps = 1e-5f},
        {.name = "llama3-8b", .n_layer = 32, .n_embd = 4096, .n_ff = 14336, .n_head = 32, .n_head_kv = 8,
         .context_length = 8192, .rope_freq_base = 500000.0f, .rms_eps = 1e-5f},
        // Qwen2.5-7B(-Instruct): Q/K/V biases, its own output head.
        {.name = "qwen2.5-7b", .n_layer = 28, .n_embd = 3584, .n_ff = 18944, .n_head = 28, .n_head_kv = 4,
         .context_length = 32768, .rope_freq_base = 1000000.0f, .rms_eps = 1e-6f, .architecture = "qwen2"},
        {.name = "qwen3-8b", .n_layer = 36, .n_embd = 4096, .n_ff = 12288, .n_head = 32, .n_head_kv = 8,
         .context_length = 40960, .rope_freq_base = 1000000.0f, .rms_eps = 1e-6f, .architecture = "qwen3",
         .head_dim = 128},
        {.name = "qwen3-14b", .n_layer = 40, .n_embd = 5120, .n_ff = 17408, .n_head = 40, .n_head_kv = 8,
         .context_length = 40960, .rope_freq_base = 1000000.0f, .rms_eps = 1e-6f, .architecture = "qwen3",
         .head_dim = 128},
        {.name = "gemma2-9b", .n_layer = 42, .n_embd = 3584, .n_ff = 14336, .n_head = 16, .n_head_kv = 8,
         .context_length = 8192, .rope_freq_base = 10000.0f, .rms_eps = 1e-6f, .architecture = "gemma2",
         .head_dim = 256, .tied_output = true, .sliding_window = 4096, .attn_logit_softcapping = 50.0f,
         .final_logit_softcapping = 30.0f},
        // Gemma 3 12B: every 6th layer global, with base 1e6 and linear scaling ×8.
        {.name = "gemma3-12b", .n_layer = 48, .n_embd = 3840, .n_ff = 15360, .n_head = 16, .n_head_kv = 8,
         .context_length = 131072, .rope_freq_base = 1000000.0f, .rms_eps = 1e-6f, .architecture = "gemma3",
         .head_dim = 256, .tied_output = true, .sliding_window = 1024, .sliding_window_pattern = 6,
         .rope_scaling_linear_factor = 8.0f},
        // Phi-4 (14B) is a phi3 model without sliding window (the converter
        // writes 0) and without LongRoPE factors.
        {.name = "phi4-14b", .n_layer = 40, .n_embd = 5120, .n_ff = 17920, .n_head = 40, .n_head_kv = 10,
         .context_length = 16384, .rope_freq_base = 250000.0f, .rms_eps = 1e-5f, .architecture = "phi3",
         .sliding_window = 0, .rope_original_context_length = 16384},
        // Qwen3-30B-A3B: 128 experts of 768, 8 used; feed_forward_length is
        // its config's (unused) dense intermediate_size.
        {.name = "qwen3-30b-a3b", .n_layer = 48, .n_embd = 2048, .n_ff = 6144, .n_head = 32, .n_head_kv = 4,
         .context_length = 40960, .rope_freq_base = 1000000.0f, .rms_eps = 1e-6f, .architecture = "qwen3moe",
         .head_dim = 128, .n_expert = 128, .n_expert_used = 8, .n_ff_expert = 768},
        // Mixtral 8x7B: a llama with 8 experts of 14336, 2 used.
        {.name = "mixtral-8x7b", .n_layer = 32, .n_embd = 4096, .n_ff = 14336, .n_head = 32, .n_head_kv = 8,
         .context_length = 32768, .rope_freq_base = 1000000.0f, .rms_eps = 1e-5f, .n_expert = 8,
         .n_expert_used = 2},
        {.name = "tiny-qwen2", .n_layer = 2, .n_embd = 128, .n_ff = 128, .n_head = 4, .n_head_kv = 2,
         .context_length = 32768, .rope_freq_base = 1000000.0f, .rms_eps = 1e-6f, .architecture = "qwen2",
         .tied_output = true},
        {.name = "tiny-qwen3", .n_layer = 2, .n_embd = 64, .n_ff = 128, .n_head = 4, .n_head_kv = 2,
         .context_length = 40960, .rope_freq_base = 1000000.0f, .rms_eps = 1e-6f, .architecture = "qwen3",
         .head_dim = 32, .tied_output = true},
        {.name = "tiny-gemma2", .n_layer = 2, .n_embd = 64, .n_ff = 128, .n_head = 4, .n_head_kv = 2,
         .context_length = 8192, .rope_freq_base = 10000.0f, .rms_eps = 1e-6f, .architecture = "gemma2",
         .head_dim = 32, .tied_output = true, .sliding_window = 8, .attn_logit_softcapping = 5.0f,
         .final_logit_softcapping = 30.0f},
        {.name = "tiny-gemma3", .n_layer = 3, .n_embd = 64, .n_ff = 128, .n_head = 4, .n_head_kv = 2,
         .context_length = 131072, .rope_freq_base = 1000000.0f, .rms_eps = 1e-6f, .architecture = "gemma3",
         .head_dim = 32, .tied_output = true, .sliding_window = 8, .sliding_window_pattern = 3,
         .rope_scaling_linear_factor = 8.0f},
        {.name = "tiny-phi3", .n_layer = 2, .n_embd = 128, .n_ff = 128, .n_head = 4, .n_head_kv = 2,
         .context_length = 16384, .rope_freq_base = 250000.0f, .rms_eps = 1e-5f, .architecture = "phi3",
         .sliding_window = 0, .rope_original_context_length = 16384},
        {.name = "tiny-qwen3moe", .n_layer = 2, .n_embd = 64, .n_ff = 192, .n_head = 4, .n_head_kv = 2,
         .context_length = 40960, .rope_freq_base = 1000000.0f, .rms_eps = 1e-6f, .architecture = "qwen3moe",
         .head_dim = 32, .n_expert = 8, .n_expert_used = 2, .n_ff_expert = 32},
        // Qwen1.5-MoE-A2.7B: 60 experts of 1408, 4 used, and a shared
        // expert of 5632.
        {.name = "qwen1.5-moe-a2.7b", .n_layer = 24, .n_embd = 2048, .n_ff = 5632, .n_head = 16, .n_head_kv = 16,
         .context_length = 8192, .rope_freq_base = 1000000.0f, .rms_eps = 1e-6f, .architecture = "qwen2moe",
         .n_expert = 60, .n_expert_used = 4, .n_ff_expert = 1408, .n_ff_shared_expert = 5632},
        {.name = "tiny-qwen2moe", .n_layer = 2, .n_embd = 64, .n_ff = 96, .n_head = 4, .n_head_kv = 2,
         .context_length = 8192, .rope_freq_base = 1000000.0f, .rms_eps = 1e-6f, .architecture = "qwen2moe",
         .n_expert = 8, .n_expert_used = 2, .n_ff_expert = 32, .n_ff_shared_expert = 64},
        {.name = "tiny-mixtral", .n_layer = 2, .n_embd = 128, .n_ff = 64, .n_head = 4, .n_head_kv = 2,
         .context_length = 32768, .rope_freq_base = 1000000.0f, .rms_eps = 1e-5f, .tied_output = true,
         .n_expert = 4, .n_expert_used = 2},
    };
    std::map<std::string, SyntheticShape> by_name;
    for (const SyntheticShape& s : list) by_name.emplace(s.name, s);
    return by_name;
  }();
  return table;
}

// How llama-quantize spreads bits over the matrices for a file type; `kNone`
// stores every matrix but the output head in the recipe's type (as Q3_K_S does).
enum class Mix { kNone, kQ2_K, kQ3_K_M, kQ3_K_L, kQ4_K_S, kQ4_K_M, kIQ4 };

// llama_ftype values (llama.h) for general.file_type.
struct Recipe {
  TensorType matrices;
  uint32_t file_type;
  Mix mix = Mix::kNone;
};
const std::map<std::string, Recipe>& recipes() {
  static const std::map<std::string, Recipe> table = {
      {"f32", {TensorType::F32, 0}},
      {"f16", {TensorType::F16, 1}},
      {"q4_0", {TensorType::Q4_0, 2}},
      {"q4_1", {TensorType::Q4_1, 3}},
      {"q8_0", {TensorType::Q8_0, 7}},
      {"q5_0", {TensorType::Q5_0, 8}},
      {"q5_1", {TensorType::Q5_1, 9}},
      {"q2_k", {TensorType::Q2_K, 10, Mix::kQ2_K}},
      {"q3_k_s", {TensorType::Q3_K, 11}},
      {"q3_k_m", {TensorType::Q3_K, 12, Mix::kQ3_K_M}},
      {"q3_k_l", {TensorType::Q3_K, 13, Mix::kQ3_K_L}},
      {"q4_k", {TensorType::Q4_K, 14, Mix::kQ4_K_S}},  // Q4_K_S
      {"q4_k_m", {TensorType::Q4_K, 15, Mix::kQ4_K_M}},
      {"q5_k", {TensorType::Q5_K, 16}},
      {"q6_k", {TensorType::Q6_K, 18}},
      {"iq4_nl", {TensorType::IQ4_NL, 25, Mix::kIQ4}},
      {"iq4_xs", {TensorType::IQ4_XS, 30, Mix::kIQ4}},
  };
  return table;
}

// The roles llama-quantize tells matrices apart by (tensor_category in
// llama.cpp's src/llama-quant.cpp), each of which gets its own type.
enum class Matrix { kTokenEmbd, kAttnQ, kAttnK, kAttnV, kAttnQkv, kAttnOutput, kFfnGate, kFfnUp, kFfnDown, kOutput };

// llama.cpp's use_more_bits: the first and last eighth of the layers and
// every third layer between them (where Q4_K_M raises attn_v and ffn_down).
bool uses_more_bits(uint32_t layer, uint32_t n_layer) {
  return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

bool is_quantized(TensorType type) { return type != TensorType::F32 && type != TensorType::F16; }

// The type llama-quantize gives `matrix` of `layer` (rows of `row_length`):
// llama_tensor_get_type in llama.cpp's src/llama-quant.cpp, for a model
// quantized without an importance matrix (its extra rules for 70B and Falcon
// are left out; those for 8-expert models, Mixtral's, are kept). Expert
// tensors (*_exps) are typed as the dense matrices of their role. The output
// head is Q6_K for every quantized type but Q8_0 (Q8_0 when its rows do not fit the recipe's
// blocks); a tied token_embd is the head and is typed as one, an untied one
// keeps the recipe's type. Each mix raises some of attn_v, attn_output and
// ffn_down; attn_v further when 4 or more query heads share a KV head
// (llama.cpp's n_gqa() >= 4). A fused attn_qkv falls in attn_v's category
// there (category_is_attn_v), so it is raised as attn_v is (the separate
// ATTENTION_QKV rule after it is never reached).
TensorType matrix_type(const Recipe& recipe, Matrix matrix, uint32_t layer, const SyntheticShape& s,
                       uint64_t row_length) {
  const TensorType base = recipe.matrices;
  if (matrix == Matrix::kOutput || (matrix == Matrix::kTokenEmbd && s.tied_output)) {
    if (!is_quantized(base)) return base;
    if (row_length % gguf::tensor_type_traits(base).block_size != 0) return TensorType::Q8_0;
    return base != TensorType::Q8_0 ? TensorType::Q6_K : base;
  }
  // "for the 8-expert model, bumping this to Q8_0 trades just ~128MB" (in
  // quantized files only: llama-quantize types an F16 or F32 file plainly).
  if (!is_quantized(base)) return base;
  if (s.n_expert == 8 && (matrix == Matrix::kAttnK || matrix == Matrix::kAttnV || matrix == Matrix::kAttnQkv)) {
    return TensorType::Q8_0;
  }
  if (s.n_expert == 8 && matrix == Matrix::kAttnOutput) {
    const bool raised = recipe.mix == Mix::kQ2_K || recipe.mix == Mix::kQ3_K_M || recipe.mix == Mix::kIQ4 ||
                        recipe.mix == Mix::kQ4_K_S || recipe.mix == Mix::kQ4_K_M ||
                        (recipe.mix == Mix::kNone && base == TensorType::Q3_K);  // Q3_K_S
    return raised ? TensorType::Q5_K : base;
  }
  const bool grouped_kv = s.n_head / s.n_head_kv >= 4;
  switch (matrix) {
    case Matrix::kAttnV:
    case Matrix::kAttnQkv:
      switch (recipe.mix) {
        case Mix::kQ2_K: return grouped_kv ? TensorType::Q4_K : TensorType::Q3_K;
        case Mix::kQ3_K_M: return layer < 2 ? TensorType::Q5_K : TensorType::Q4_K;
        case Mix::kQ3_K_L: return TensorType::Q5_K;
        case Mix::kIQ4: return grouped_kv ? TensorType::Q5_K : base;
        case Mix::kQ4_K_S: return layer < 4 ? TensorType::Q5_K : base;
        case Mix::kQ4_K_M: return uses_more_bits(layer, s.n_layer) ? TensorType::Q6_K : base;
        default: return base;
      }
    case Matrix::kFfnDown:
      switch (recipe.mix) {
        case Mix::kQ2_K: return TensorType::Q3_K;
        case Mix::kQ3_K_M: return layer < s.n_layer / 16 ? TensorType::Q5_K : TensorType::Q4_K;
        case Mix::kQ3_K_L: return TensorType::Q5_K;
        case Mix::kIQ4:
        case Mix::kQ4_K_S: return layer < s.n_layer / 8 ? TensorType::Q5_K : base;
        case Mix::kQ4_K_M: return uses_more_bits(layer, s.n_layer) ? TensorType::Q6_K : base;
        default: return base;
      }
    case Matrix::kAttnOutput:
      switch (recipe.mix) {
        case Mix::kQ2_K: return TensorType::Q3_K;
        case Mix::kQ3_K_M: return TensorType::Q4_K;
        case Mix::kQ3_K_L: return TensorType::Q5_K;
        default: return base;
      }
    default: return base;
  }
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Approximately normal values: the sum of four 16-bit uniforms (Irwin-Hall),
// one 64-bit random number per value; fast enough for billions of weights.
void fill_gaussian(float* out, uint64_t n, uint64_t seed, float mean, float stddev) {
  constexpr float kScale = 1.7320508f / 65536.0f;  // sqrt(3): the sum of 4 uniforms has variance 1/3
  uint64_t state = seed;
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t r = splitmix64(state);
    const float sum = static_cast<float>((r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48));
    out[i] = mean + stddev * (sum * kScale - 2.0f * 1.7320508f);
  }
}

// The requested type when the row length fits its blocks, else the nearest
// type that does (as llama-quantize falls back for odd shapes).
TensorType fitting_type(TensorType wanted, uint64_t row_length, const std::string& name,
                        std::vector<std::string>& notes) {
  if (row_length % gguf::tensor_type_traits(wanted).block_size == 0) return wanted;
  const TensorType fallback = row_length % 32 == 0 ? TensorType::Q8_0 : TensorType::F16;
  notes.push_back(name + ": row length " + std::to_string(row_length) + " does not fit " +
                  std::string(gguf::tensor_type_name(wanted)) + " blocks, stored as " +
                  std::string(gguf::tensor_type_name(fallback)));
  return fallback;
}

// Widths of one layer's projections.
struct LayerDims {
  uint64_t n_embd, n_ff, head_dim;
  uint64_t q_width;   // n_head × head_dim
  uint64_t kv_width;  // n_head_kv × head_dim
  uint64_t n_expert;     // 0: a dense FFN
  uint64_t n_ff_expert;  // one expert's FFN width
  uint64_t n_ff_shared_expert;  // 0: no shared expert
};

// Collects a model's tensors in file order, each typed as llama-quantize
// would type it. Matrices are drawn with a standard deviation of
// 1/√(row length), so every projection keeps its input's scale; norm weights
// near 1, biases small against the projections' unit-scale outputs.
class TensorPlanner {
 public:
  TensorPlanner(const SyntheticShape& shape, const Recipe& recipe, SyntheticPlan& plan)
      : shape_(shape), recipe_(recipe), plan_(plan) {}

  void matrix(std::string name, Matrix role, uint32_t layer, uint64_t cols, uint64_t rows, float stddev) {
    const TensorType wanted = matrix_type(recipe_, role, layer, shape_, cols);
    add({name, fitting_type(wanted, cols, name, plan_.notes), {cols, rows}, 0.0f, stddev});
  }
  void matrix(std::string name, Matrix role, uint32_t layer, uint64_t cols, uint64_t rows) {
    matrix(std::move(name), role, layer, cols, rows, 1.0f / std::sqrt(static_cast<float>(cols)));
  }
  // n_expert matrices of `role` stacked in one 3-D tensor, as
  // llama.cpp's converter merges the experts.
  void experts(std::string name, Matrix role, uint32_t layer, uint64_t cols, uint64_t rows, uint64_t n_expert) {
    const TensorType wanted = matrix_type(recipe_, role, layer, shape_, cols);
    add({name, fitting_type(wanted, cols, name, plan_.notes), {cols, rows, n_expert}, 0.0f,
         1.0f / std::sqrt(static_cast<float>(cols))});
  }
  // A matrix llama-quantize leaves in F32 (the expert router).
  void f32_matrix(std::string name, uint64_t cols, uint64_t rows) {
    add({std::move(name), TensorType::F32, {cols, rows}, 0.0f, 1.0f / std::sqrt(static_cast<float>(cols))});
  }
  void norm(std::string name, uint64_t n) { add({std::move(name), TensorType::F32, {n}, 1.0f, 0.1f}); }
  void bias(std::string name, uint64_t n) { add({std::move(name), TensorType::F32, {n}, 0.0f, 0.02f}); }

 private:
  void add(SyntheticTensor t) {
    uint64_t elements = 1;
    for (uint64_t d : t.dims) elements *= d;
    plan_.parameter_count += elements;
    const gguf::TensorTypeTraits traits = gguf::tensor_type_traits(t.type);
    plan_.tensor_bytes += elements / traits.block_size * traits.bytes_per_block;
    plan_.tensors.push_back(std::move(t));
  }
  const SyntheticShape& shape_;
  const Recipe& recipe_;
  SyntheticPlan& plan_;
};

// One layer's tensors, named blk.N.<name>.
struct Layer {
  TensorPlanner& planner;
  uint32_t index;
  const LayerDims& d;

  std::string name(const char* suffix) const { return "blk." + std::to_string(index) + "." + suffix; }
  void norm(const char* suffix, uint64_t n) { planner.norm(name(suffix), n); }
  void bias(const char* suffix, uint64_t n) { planner.bias(name(suffix), n); }
  void matrix(const char* suffix, Matrix role, uint64_t cols, uint64_t rows) {
    planner.matrix(name(suffix), role, index, cols, rows);
  }
  void experts(const char* suffix, Matrix role, uint64_t cols, uint64_t rows) {
    planner.experts(name(suffix), role, index, cols, rows, d.n_expert);
  }
  void f32_matrix(const char* suffix, uint64_t cols, uint64_t rows) { planner.f32_matrix(name(suffix), cols, rows); }
};

struct Architecture;
using BlockTensors = void (*)(Layer& layer, const Architecture& arch);

// What llama.cpp's converter writes for one architecture, beyond the keys
// and tensors every one of them has.
struct Architecture {
  std::string_view name;  // general.architecture and the prefix of its keys
  BlockTensors block;     // one layer's tensors, in the converter's order
  bool qkv_bias = false;  // attn_q/k/v.bias (qwen2)
  bool qk_norm = false;   // attn_q_norm / attn_k_norm [head_dim] (qwen3, gemma3)
  bool writes_head_dim = false;              // attention.key_length / value_length from config's head_dim
  bool writes_rope_dimension_count = false;  // rope.dimension_count (llama, phi3)
  bool writes_vocab_size = false;            // vocab_size (llama)
  bool output_always_tied = false;           // llama.cpp never reads an output.weight (gemma2)
  bool may_have_experts = false;             // expert_count / expert_used_count when the shape has experts (llama)
  bool experts_required = false;             // (qwen3moe)
  bool writes_expert_ff_length = false;      // expert_feed_forward_length (qwen3moe)
  bool shared_expert = false;  // ffn_*_shexp and expert_shared_feed_forward_length (qwen2moe)
};

void separate_qkv(Layer& l, bool biases) {
  l.matrix("attn_q.weight", Matrix::kAttnQ, l.d.n_embd, l.d.q_width);
  l.matrix("attn_k.weight", Matrix::kAttnK, l.d.n_embd, l.d.kv_width);
  l.matrix("attn_v.weight", Matrix::kAttnV, l.d.n_embd, l.d.kv_width);
  if (biases) {
    l.bias("attn_q.bias", l.d.q_width);
    l.bias("attn_k.bias", l.d.kv_width);
    l.bias("attn_v.bias", l.d.kv_width);
  }
}

void qk_norms(Layer& l) {
  l.norm("attn_q_norm.weight", l.d.head_dim);
  l.norm("attn_k_norm.weight", l.d.head_dim);
}

void gated_ffn(Layer& l) {
  l.norm("ffn_norm.weight", l.d.n_embd);
  if (l.d.n_expert != 0) {
    l.f32_matrix("ffn_gate_inp.weight", l.d.n_embd, l.d.n_expert);
    l.experts("ffn_gate_exps.weight", Matrix::kFfnGate, l.d.n_embd, l.d.n_ff_expert);
    l.experts("ffn_up_exps.weight", Matrix::kFfnUp, l.d.n_embd, l.d.n_ff_expert);
    l.experts("ffn_down_exps.weight", Matrix::kFfnDown, l.d.n_ff_expert, l.d.n_embd);
    if (l.d.n_ff_shared_expert != 0) {
      l.f32_matrix("ffn_gate_inp_shexp.weight", l.d.n_embd, 1);
      l.matrix("ffn_gate_shexp.weight", Matrix::kFfnGate, l.d.n_embd, l.d.n_ff_shared_expert);
      l.matrix("ffn_up_shexp.weight", Matrix::kFfnUp, l.d.n_embd, l.d.n_ff_shared_expert);
      l.matrix("ffn_down_shexp.weight", Matrix::kFfnDown, l.d.n_ff_shared_expert, l.d.n_embd);
    }
    return;
  }
  l.matrix("ffn_gate.weight", Matrix::kFfnGate, l.d.n_embd, l.d.n_ff);
  l.matrix("ffn_up.weight", Matrix::kFfnUp, l.d.n_embd, l.d.n_ff);
  l.matrix("ffn_down.weight", Matrix::kFfnDown, l.d.n_ff, l.d.n_embd);
}

// llama, qwen2 (with Q/K/V biases) and qwen3 (with per-head Q/K norms).
void llama_block(Layer& l, const Architecture& arch) {
  l.norm("attn_norm.weight", l.d.n_embd);
  separate_qkv(l, arch.qkv_bias);
  l.matrix("attn_output.weight", Matrix::kAttnOutput, l.d.q_width, l.d.n_embd);
  if (arch.qk_norm) qk_norms(l);
  gated_ffn(l);
}

// gemma2 and gemma3 (with per-head Q/K norms): each branch's output is
// normalised again before the residual add.
void gemma_block(Layer& l, const Architecture& arch) {
  l.norm("attn_norm.weight", l.d.n_embd);
  separate_qkv(l, false);
  l.matrix("attn_output.weight", Matrix::kAttnOutput, l.d.q_width, l.d.n_embd);
  if (arch.qk_norm) qk_norms(l);
  l.norm("post_attention_norm.weight", l.d.n_embd);
  gated_ffn(l);
  l.norm("post_ffw_norm.weight", l.d.n_embd);
}

// phi3: one fused Q/K/V projection (rows Q, then K, then V), and ffn_up
// holds the gate rows then the up rows.
void phi3_block(Layer& l, const Architecture&) {
  l.norm("attn_norm.weight", l.d.n_embd);
  l.matrix("attn_qkv.weight", Matrix::kAttnQkv, l.d.n_embd, l.d.q_width + 2 * l.d.kv_width);
  l.matrix("attn_output.weight", Matrix::kAttnOutput, l.d.q_width, l.d.n_embd);
  l.norm("ffn_norm.weight", l.d.n_embd);
  l.matrix("ffn_up.weight", Matrix::kFfnUp, l.d.n_embd, 2 * l.d.n_ff);
  l.matrix("ffn_down.weight", Matrix::kFfnDown, l.d.n_ff, l.d.n_embd);
}

// As llama.cpp's src/models/<arch>.cpp loads them and its converter
// (convert_hf_to_gguf.py) writes them.
constexpr Architecture kArchitectures[] = {
    {.name = "llama",
     .block = llama_block,
     .writes_rope_dimension_count = true,
     .writes_vocab_size = true,
     .may_have_experts = true},
    {.name = "qwen2", .block = llama_block, .qkv_bias = true},
    {.name = "qwen3", .block = llama_block, .qk_norm = true, .writes_head_dim = true},
    {.name = "qwen2moe",
     .block = llama_block,
     .qkv_bias = true,
     .may_have_experts = true,
     .experts_required = true,
     .writes_expert_ff_length = true,
     .shared_expert = true},
    {.name = "qwen3moe",
     .block = llama_block,
     .qk_norm = true,
     .writes_head_dim = true,
     .may_have_experts = true,
     .experts_required = true,
     .writes_expert_ff_length = true},
    {.name = "gemma2", .block = gemma_block, .writes_head_dim = true, .output_always_tied = true},
    {.name = "gemma3", .block = gemma_block, .qk_norm = true, .writes_head_dim = true},
    {.name = "phi3", .block = phi3_block, .writes_rope_dimension_count = true},
};

std::string architecture_list() {
  std::string list;
  for (const Architecture& a : kArchitectures) list += (list.empty() ? "" : ", ") + std::string(a.name);
  return list;
}

const Architecture& find_architecture(const std::string& name) {
  for (const Architecture& a : kArchitectures) {
    if (a.name == name) return a;
  }
  throw Error("unknown architecture '" + name + "' for a synthetic model (known: " + architecture_list() + ")");
}

void validate(const SyntheticShape& s, const Architecture& arch) {
  if (s.n_layer == 0 || s.n_embd == 0 || s.n_ff == 0 || s.n_head == 0 || s.n_head_kv == 0) {
    throw Error("synthetic model shape needs non-zero layers, embedding, feed-forward and head counts");
  }
  if (s.head_dim == 0 && s.n_embd % s.n_head != 0) {
    throw Error("embedding length " + std::to_string(s.n_embd) + " is not divisible by " +
                std::to_string(s.n_head) + " heads");
  }
  if (!arch.writes_head_dim && s.head_dim != 0 && static_cast<uint64_t>(s.head_dim) * s.n_head != s.n_embd) {
    throw Error("the " + s.architecture + " architecture takes its head dimension from embedding length / heads (" +
                std::to_string(s.n_embd) + " / " + std::to_string(s.n_head) + "): leave the head dimension unset");
  }
  if (s.n_head % s.n_head_kv != 0) {
    throw Error(std::to_string(s.n_head) + " heads are not divisible by " + std::to_string(s.n_head_kv) +
                " KV heads");
  }
  if (s.head_width() % 2 != 0) throw Error("the head dimension must be even for RoPE");
  if (arch.experts_required && s.n_expert == 0) {
    throw Error("the " + s.architecture + " architecture has mixture-of-experts layers: give it experts");
  }
  if (s.n_expert != 0 && !arch.may_have_experts) {
    throw Error("the " + s.architecture + " architecture has no mixture-of-experts layers: leave the experts unset");
  }
  if (s.n_expert != 0 && (s.n_expert_used == 0 || s.n_expert_used > s.n_expert)) {
    throw Error("experts used per token (" + std::to_string(s.n_expert_used) + ") must be between 1 and " +
                std::to_string(s.n_expert));
  }
  if (s.n_expert > 512) throw Error("at most 512 experts (" + std::to_string(s.n_expert) + " asked)");
  if (arch.output_always_tied && !s.tied_output) {
    throw Error("the " + s.architecture + " architecture always uses token_embd as its output head: tie it");
  }
}

const Recipe& find_recipe(const std::string& name) {
  auto it = recipes().find(name);
  if (it == recipes().end()) throw Error("unknown weight type '" + name + "'");
  return it->second;
}

// The hyperparameter keys, under the architecture's prefix, in the order
// the converter writes them.
void set_hparams(gguf::Metadata& m, const SyntheticShape& s, const Architecture& arch, uint64_t n_vocab) {
  const std::string p = s.architecture + ".";
  m.set(p + "context_length", gguf::Value(s.context_length));
  m.set(p + "embedding_length", gguf::Value(s.n_embd));
  m.set(p + "block_count", gguf::Value(s.n_layer));
  m.set(p + "feed_forward_length", gguf::Value(s.n_ff));
  m.set(p + "attention.head_count", gguf::Value(s.n_head));
  m.set(p + "attention.head_count_kv", gguf::Value(s.n_head_kv));
  if (arch.writes_rope_dimension_count) m.set(p + "rope.dimension_count", gguf::Value(s.head_width()));
  m.set(p + "rope.freq_base", gguf::Value(s.rope_freq_base));
  m.set(p + "attention.layer_norm_rms_epsilon", gguf::Value(s.rms_eps));
  if (arch.writes_vocab_size) m.set(p + "vocab_size", gguf::Value(static_cast<uint32_t>(n_vocab)));
  if (s.n_expert != 0) {
    m.set(p + "expert_count", gguf::Value(s.n_expert));
    m.set(p + "expert_used_count", gguf::Value(s.n_expert_used));
  }
  if (arch.writes_head_dim) {
    m.set(p + "attention.key_length", gguf::Value(s.head_width()));
    m.set(p + "attention.value_length", gguf::Value(s.head_width()));
  }
  if (arch.writes_expert_ff_length) m.set(p + "expert_feed_forward_length", gguf::Value(s.expert_width()));
  if (arch.shared_expert) {
    m.set(p + "expert_shared_feed_forward_length", gguf::Value(s.shared_expert_width()));
  }
  if (s.attn_logit_softcapping != 0.0f) m.set(p + "attn_logit_softcapping", gguf::Value(s.attn_logit_softcapping));
  if (s.final_logit_softcapping != 0.0f) {
    m.set(p + "final_logit_softcapping", gguf::Value(s.final_logit_softcapping));
  }
  if (s.sliding_window) m.set(p + "attention.sliding_window", gguf::Value(*s.sliding_window));
  if (s.sliding_window_pattern != 0) {
    m.set(p + "attention.sliding_window_pattern", gguf::Value(s.sliding_window_pattern));
  }
  if (s.rope_scaling_linear_factor != 0.0f) {
    m.set(p + "rope.scaling.type", gguf::Value("linear"));
    m.set(p + "rope.scaling.factor", gguf::Value(s.rope_scaling_linear_factor));
  }
  if (s.rope_original_context_length != 0) {
    m.set(p + "rope.scaling.original_context_length", gguf::Value(s.rope_original_context_length));
  }
}

}  // namespace

std::optional<SyntheticShape> synthetic_shape(const std::string& name) {
  auto it = shapes().find(name);
  if (it == shapes().end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> synthetic_shape_names() {
  std::vector<std::string> names;
  for (const auto& [name, shape] : shapes()) names.push_back(name);
  return names;
}

std::vector<std::string> synthetic_architectures() {
  std::vector<std::string> names;
  for (const Architecture& a : kArchitectures) names.emplace_back(a.name);
  return names;
}

std::vector<std::string> synthetic_weight_recipes() {
  std::vector<std::string> names;
  for (const auto& [name, recipe] : recipes()) names.push_back(name);
  return names;
}

SyntheticPlan plan_synthetic_model(const SyntheticShape& s, const std::string& recipe_name, uint64_t n_vocab) {
  const Architecture& arch = find_architecture(s.architecture);
  validate(s, arch);
  const Recipe& recipe = find_recipe(recipe_name);

  SyntheticPlan plan;
  TensorPlanner planner(s, recipe, plan);
  const LayerDims dims{s.n_embd,
                       s.n_ff,
                       s.head_width(),
                       uint64_t{s.n_head} * s.head_width(),
                       uint64_t{s.n_head_kv} * s.head_width(),
                       s.n_expert,
                       s.expert_width(),
                       arch.shared_expert ? s.shared_expert_width() : 0};
  const float head_stddev = 4.0f / std::sqrt(static_cast<float>(s.n_embd));
  // A tied token_embd is also the output head, so it is drawn at the head's scale.
  planner.matrix("token_embd.weight", Matrix::kTokenEmbd, 0, s.n_embd, n_vocab, s.tied_output ? head_stddev : 1.0f);
  for (uint32_t i = 0; i < s.n_layer; ++i) {
    Layer layer{planner, i, dims};
    arch.block(layer, arch);
  }
  planner.norm("output_norm.weight", s.n_embd);
  if (!s.tied_output) planner.matrix("output.weight", Matrix::kOutput, 0, s.n_embd, n_vocab, head_stddev);
  return plan;
}

SyntheticReport write_synthetic_llama(const SyntheticOptions& options, const std::string& path) {
  const SyntheticShape& s = options.shape;
  const Architecture& arch = find_architecture(s.architecture);
  validate(s, arch);
  const Recipe& recipe = find_recipe(options.recipe);
  if (options.tokenizer_source == nullptr) throw Error("a synthetic model needs a tokenizer source GGUF");
  const gguf::Metadata& source = options.tokenizer_source->metadata();
  if (!source.contains("tokenizer.ggml.tokens")) {
    throw Error("the tokenizer source has no tokenizer.ggml.tokens: pick a GGUF that carries a tokenizer");
  }
  const uint64_t n_vocab = source.get_array_value("tokenizer.ggml.tokens").items.size();
  const SyntheticPlan plan = plan_synthetic_model(s, options.recipe, n_vocab);

  SyntheticReport report;
  report.parameter_count = plan.parameter_count;
  report.notes = plan.notes;

  gguf::Writer writer;
  gguf::Metadata& m = writer.metadata();
  m.set("general.architecture", gguf::Value(s.architecture));
  m.set("general.name", gguf::Value("m40-llm synthetic " + s.name + " " + options.recipe));
  m.set("general.file_type", gguf::Value(recipe.file_type));
  if (is_quantized(recipe.matrices)) m.set("general.quantization_version", gguf::Value(uint32_t{2}));
  m.set("m40.synthetic_seed", gguf::Value(options.seed));
  set_hparams(m, s, arch, n_vocab);
  for (const auto& [key, value] : source.entries()) {
    if (key.rfind("tokenizer.", 0) == 0) m.set(key, value);
  }

  const unsigned threads = options.threads != 0 ? options.threads : default_thread_count();
  for (size_t index = 0; index < plan.tensors.size(); ++index) {
    const SyntheticTensor& t = plan.tensors[index];
    const uint64_t tensor_seed = options.seed * 0x100000001B3ull + index;
    writer.add_tensor(t.name, t.type, t.dims, [t, tensor_seed, threads](std::span<uint8_t> out) {
      uint64_t all_rows = 1;  // a 3-D expert tensor: rows of every expert
      for (size_t d = 1; d < t.dims.size(); ++d) all_rows *= t.dims[d];
      const int64_t rows = static_cast<int64_t>(all_rows);
      const int64_t row_length = static_cast<int64_t>(t.dims[0]);
      const uint64_t row_bytes = out.size() / static_cast<uint64_t>(rows);
      parallel_for(rows, threads, [&](int64_t begin, int64_t end) {
        std::vector<float> values(static_cast<size_t>(row_length));
        for (int64_t r = begin; r < end; ++r) {
          uint64_t row_state = tensor_seed ^ (static_cast<uint64_t>(r) * 0xD1B54A32D192ED03ull);
          fill_gaussian(values.data(), values.size(), splitmix64(row_state), t.mean, t.stddev);
          quant::quantize_row(t.type, values.data(), out.data() + static_cast<uint64_t>(r) * row_bytes, row_length);
        }
      });
    });
  }

  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty() && !std::filesystem::is_directory(parent)) {
    throw Error("cannot write '" + path + "': the folder " + parent.string() + " does not exist");
  }
  writer.write(path);
  report.file_bytes = std::filesystem::file_size(path);
  return report;
}

}  // namespace m40::model
