#include "model/synthetic_llama.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "common/error.h"
#include "common/parallel_for.h"
#include "gguf/writer.h"
#include "quant/quantize.h"

namespace m40::model {

using gguf::TensorType;

namespace {

// Named shapes from the published model configurations.
const std::map<std::string, SyntheticShape>& shapes() {
  static const std::map<std::string, SyntheticShape> table = {
      {"tiny", {"tiny", 2, 256, 768, 4, 2, 512, 10000.0f, 1e-5f}},
      {"llama2-7b", {"llama2-7b", 32, 4096, 11008, 32, 32, 4096, 10000.0f, 1e-5f}},
      {"llama2-13b", {"llama2-13b", 40, 5120, 13824, 40, 40, 4096, 10000.0f, 1e-5f}},
      {"llama3-8b", {"llama3-8b", 32, 4096, 14336, 32, 8, 8192, 500000.0f, 1e-5f}},
  };
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

// The weight matrices of a llama model, each of which gets its own type.
enum class Matrix { kTokenEmbd, kAttnQ, kAttnK, kAttnV, kAttnOutput, kFfnGate, kFfnUp, kFfnDown, kOutput };

// llama.cpp's use_more_bits: the first and last eighth of the layers and
// every third layer between them (where Q4_K_M raises attn_v and ffn_down).
bool uses_more_bits(uint32_t layer, uint32_t n_layer) {
  return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

// The type llama-quantize gives `matrix` of `layer`: llama_tensor_get_type in
// llama.cpp's src/llama-quant.cpp, for a llama model quantized without an
// importance matrix (its extra rules for 70B and mixture-of-experts models are
// left out). token_embd keeps the recipe's type, the output head is Q6_K for
// every quantized type but Q8_0, and each mix raises some of attn_v,
// attn_output and ffn_down; attn_v further when 4 or more query heads share a
// KV head (llama.cpp's n_gqa() >= 4).
TensorType matrix_type(const Recipe& recipe, Matrix matrix, uint32_t layer, const SyntheticShape& s) {
  const TensorType base = recipe.matrices;
  if (matrix == Matrix::kOutput) {
    const bool quantized = base != TensorType::F32 && base != TensorType::F16;
    return quantized && base != TensorType::Q8_0 ? TensorType::Q6_K : base;
  }
  const bool grouped_kv = s.n_head / s.n_head_kv >= 4;
  switch (matrix) {
    case Matrix::kAttnV:
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

struct PlannedTensor {
  std::string name;
  TensorType type;
  std::vector<uint64_t> dims;
  float mean;
  float stddev;
};

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

void validate(const SyntheticShape& s) {
  if (s.n_layer == 0 || s.n_embd == 0 || s.n_ff == 0 || s.n_head == 0 || s.n_head_kv == 0) {
    throw Error("synthetic model shape needs non-zero layers, embedding, feed-forward and head counts");
  }
  if (s.n_embd % s.n_head != 0) {
    throw Error("embedding length " + std::to_string(s.n_embd) + " is not divisible by " +
                std::to_string(s.n_head) + " heads");
  }
  if (s.n_head % s.n_head_kv != 0) {
    throw Error(std::to_string(s.n_head) + " heads are not divisible by " + std::to_string(s.n_head_kv) +
                " KV heads");
  }
  if ((s.n_embd / s.n_head) % 2 != 0) throw Error("the head dimension must be even for RoPE");
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

std::vector<std::string> synthetic_weight_recipes() {
  std::vector<std::string> names;
  for (const auto& [name, recipe] : recipes()) names.push_back(name);
  return names;
}

SyntheticReport write_synthetic_llama(const SyntheticOptions& options, const std::string& path) {
  const SyntheticShape& s = options.shape;
  validate(s);
  auto recipe_it = recipes().find(options.recipe);
  if (recipe_it == recipes().end()) throw Error("unknown weight type '" + options.recipe + "'");
  const Recipe recipe = recipe_it->second;
  if (options.tokenizer_source == nullptr) throw Error("a synthetic model needs a tokenizer source GGUF");
  const gguf::Metadata& source = options.tokenizer_source->metadata();
  if (!source.contains("tokenizer.ggml.tokens")) {
    throw Error("the tokenizer source has no tokenizer.ggml.tokens: pick a GGUF that carries a tokenizer");
  }
  const uint64_t n_vocab = source.get_array_value("tokenizer.ggml.tokens").items.size();

  SyntheticReport report;
  const uint64_t n_embd = s.n_embd, n_ff = s.n_ff;
  const uint64_t head_dim = n_embd / s.n_head;
  const uint64_t n_embd_kv = head_dim * s.n_head_kv;
  const bool quantized = recipe.matrices != TensorType::F32 && recipe.matrices != TensorType::F16;

  const float sd_embd = 1.0f / std::sqrt(static_cast<float>(n_embd));
  const float sd_ff = 1.0f / std::sqrt(static_cast<float>(n_ff));
  std::vector<PlannedTensor> plan;
  auto matrix = [&](std::string name, TensorType type, uint64_t cols, uint64_t rows, float sd) {
    plan.push_back({name, fitting_type(type, cols, name, report.notes), {cols, rows}, 0.0f, sd});
  };
  auto norm = [&](std::string name) { plan.push_back({std::move(name), TensorType::F32, {n_embd}, 1.0f, 0.1f}); };

  auto type_of = [&](Matrix m, uint32_t layer) { return matrix_type(recipe, m, layer, s); };
  matrix("token_embd.weight", type_of(Matrix::kTokenEmbd, 0), n_embd, n_vocab, 1.0f);
  for (uint32_t i = 0; i < s.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    norm(p + "attn_norm.weight");
    matrix(p + "attn_q.weight", type_of(Matrix::kAttnQ, i), n_embd, n_embd, sd_embd);
    matrix(p + "attn_k.weight", type_of(Matrix::kAttnK, i), n_embd, n_embd_kv, sd_embd);
    matrix(p + "attn_v.weight", type_of(Matrix::kAttnV, i), n_embd, n_embd_kv, sd_embd);
    matrix(p + "attn_output.weight", type_of(Matrix::kAttnOutput, i), n_embd, n_embd, sd_embd);
    norm(p + "ffn_norm.weight");
    matrix(p + "ffn_gate.weight", type_of(Matrix::kFfnGate, i), n_embd, n_ff, sd_embd);
    matrix(p + "ffn_up.weight", type_of(Matrix::kFfnUp, i), n_embd, n_ff, sd_embd);
    matrix(p + "ffn_down.weight", type_of(Matrix::kFfnDown, i), n_ff, n_embd, sd_ff);
  }
  norm("output_norm.weight");
  matrix("output.weight", type_of(Matrix::kOutput, 0), n_embd, n_vocab, 4.0f * sd_embd);

  gguf::Writer writer;
  gguf::Metadata& m = writer.metadata();
  m.set("general.architecture", gguf::Value("llama"));
  m.set("general.name", gguf::Value("m40-llm synthetic " + s.name + " " + options.recipe));
  m.set("general.file_type", gguf::Value(recipe.file_type));
  if (quantized) m.set("general.quantization_version", gguf::Value(uint32_t{2}));
  m.set("m40.synthetic_seed", gguf::Value(options.seed));
  m.set("llama.context_length", gguf::Value(s.context_length));
  m.set("llama.embedding_length", gguf::Value(s.n_embd));
  m.set("llama.block_count", gguf::Value(s.n_layer));
  m.set("llama.feed_forward_length", gguf::Value(s.n_ff));
  m.set("llama.attention.head_count", gguf::Value(s.n_head));
  m.set("llama.attention.head_count_kv", gguf::Value(s.n_head_kv));
  m.set("llama.rope.dimension_count", gguf::Value(static_cast<uint32_t>(head_dim)));
  m.set("llama.rope.freq_base", gguf::Value(s.rope_freq_base));
  m.set("llama.attention.layer_norm_rms_epsilon", gguf::Value(s.rms_eps));
  m.set("llama.vocab_size", gguf::Value(static_cast<uint32_t>(n_vocab)));
  for (const auto& [key, value] : source.entries()) {
    if (key.rfind("tokenizer.", 0) == 0) m.set(key, value);
  }

  const unsigned threads = options.threads != 0 ? options.threads : default_thread_count();
  for (size_t index = 0; index < plan.size(); ++index) {
    const PlannedTensor& t = plan[index];
    uint64_t elements = 1;
    for (uint64_t d : t.dims) elements *= d;
    report.parameter_count += elements;
    const uint64_t tensor_seed = options.seed * 0x100000001B3ull + index;
    writer.add_tensor(t.name, t.type, t.dims, [t, tensor_seed, threads](std::span<uint8_t> out) {
      const int64_t rows = static_cast<int64_t>(t.dims.size() > 1 ? t.dims[1] : 1);
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
