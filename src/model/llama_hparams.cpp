#include "model/llama_hparams.h"

#include <cmath>
#include <variant>

#include "gguf/file.h"

namespace m40::model {

namespace {

// One row per architecture: adding a llama-shaped architecture is one line.
constexpr ArchitectureTraits kArchitectures[] = {
    // name     rope style         qkv bias  qk norm  runnable
    {"llama", RopeStyle::Normal, false, false, true},
    {"qwen2", RopeStyle::NeoX, true, false, false},
    {"qwen3", RopeStyle::NeoX, false, true, false},
};

struct RopeScalingName {
  RopeScaling scaling;
  std::string_view name;
};
constexpr RopeScalingName kRopeScalingNames[] = {
    {RopeScaling::None, "none"},
    {RopeScaling::Linear, "linear"},
    {RopeScaling::Yarn, "yarn"},
    {RopeScaling::LongRope, "longrope"},
};

std::string known_architecture_list() {
  std::string list;
  for (const auto& a : kArchitectures) {
    if (!list.empty()) list += ", ";
    list += a.name;
  }
  return list;
}

// Reads keys under one architecture prefix; every error names the full key.
class KeyReader {
 public:
  KeyReader(const gguf::Metadata& metadata, std::string_view arch) : metadata_(metadata), arch_(arch) {}

  template <class T> T required(std::string_view suffix) const {
    const std::string key = arch_key(arch_, suffix);
    if (!metadata_.contains(key)) {
      throw HparamsError("metadata key '" + key + "' is missing (a " + std::string(arch_) +
                         " model needs it)");
    }
    return convert<T>(key);
  }

  template <class T> std::optional<T> optional(std::string_view suffix) const {
    const std::string key = arch_key(arch_, suffix);
    if (!metadata_.contains(key)) return std::nullopt;
    return convert<T>(key);
  }

 private:
  template <class T> T convert(const std::string& key) const {
    try {
      return metadata_.get<T>(key);
    } catch (const HparamsError&) {
      throw;
    } catch (const gguf::MetadataError& e) {
      throw HparamsError(e.what());
    }
  }

  const gguf::Metadata& metadata_;
  std::string_view arch_;
};

// Widest query or key/value projection (n_head * head_dim) accepted: far above
// any real model (Llama 3.1 405B: 16384), low enough that row and element
// counts stay in int32 everywhere they are used.
constexpr uint64_t kMaxProjectionWidth = uint64_t{1} << 20;

[[noreturn]] void inconsistent(const std::string& message) { throw HparamsError(message); }

uint32_t vocabulary_size(const gguf::Metadata& metadata, const KeyReader& keys, std::string_view arch,
                         const gguf::TensorInfo* token_embd) {
  std::optional<uint64_t> n_tokens;  // the tokenizer's vocabulary, when the file has one
  if (const gguf::Value* tokens = metadata.find("tokenizer.ggml.tokens")) {
    const auto* array = std::get_if<gguf::Array>(&tokens->storage);
    if (array == nullptr) {
      throw HparamsError("metadata key 'tokenizer.ggml.tokens' has type " +
                         std::string(gguf::value_type_name(tokens->type())) + ", expected array");
    }
    n_tokens = array->items.size();
  }
  if (auto n = keys.optional<uint32_t>("vocab_size")) {
    // The model could sample ids the tokenizer cannot decode. llama.cpp's
    // converter pads the token list itself ([PAD...]) when a model rounds its
    // vocabulary up, so a well-formed file never has fewer tokens than rows.
    if (n_tokens && *n > *n_tokens) {
      throw HparamsError(arch_key(arch, "vocab_size") + " (" + std::to_string(*n) +
                         ") exceeds the tokenizer's vocabulary (" + std::to_string(*n_tokens) +
                         " entries in tokenizer.ggml.tokens): the model could produce tokens that cannot be decoded");
    }
    return *n;
  }
  if (n_tokens) return static_cast<uint32_t>(*n_tokens);
  if (token_embd != nullptr && token_embd->dims.size() >= 2) {
    return static_cast<uint32_t>(token_embd->dims[1]);
  }
  throw HparamsError("the vocabulary size is unknown: metadata has neither '" + arch_key(arch, "vocab_size") +
                     "' nor 'tokenizer.ggml.tokens', and there is no token_embd.weight");
}

}  // namespace

std::string_view rope_style_name(RopeStyle style) {
  return style == RopeStyle::Normal ? "normal" : "neox";
}

std::string_view rope_scaling_name(RopeScaling scaling) {
  for (const auto& s : kRopeScalingNames) {
    if (s.scaling == scaling) return s.name;
  }
  return "unknown";
}

std::optional<RopeScaling> rope_scaling_from_name(std::string_view name) {
  for (const auto& s : kRopeScalingNames) {
    if (s.name == name) return s.scaling;
  }
  return std::nullopt;
}

std::span<const ArchitectureTraits> known_architectures() { return kArchitectures; }

const ArchitectureTraits* find_architecture(std::string_view name) {
  for (const auto& a : kArchitectures) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

std::string arch_key(std::string_view architecture, std::string_view suffix) {
  std::string key(architecture);
  key += '.';
  key += suffix;
  return key;
}

LlamaHparams LlamaHparams::from_metadata(const gguf::Metadata& metadata, const gguf::TensorInfo* token_embd) {
  LlamaHparams hp;
  if (!metadata.contains("general.architecture")) {
    throw HparamsError("metadata key 'general.architecture' is missing");
  }
  try {
    hp.architecture = metadata.get<std::string>("general.architecture");
  } catch (const gguf::MetadataError& e) {
    throw HparamsError(e.what());
  }
  hp.traits = find_architecture(hp.architecture);
  if (hp.traits == nullptr) {
    throw HparamsError("unsupported architecture " + hp.architecture + " (general.architecture): m40-llm knows " +
                       "the llama family (" + known_architecture_list() + ")");
  }
  const std::string& arch = hp.architecture;
  const KeyReader keys(metadata, arch);

  hp.n_layer = keys.required<uint32_t>("block_count");
  hp.n_embd = keys.required<uint32_t>("embedding_length");
  hp.n_ff = keys.required<uint32_t>("feed_forward_length");
  hp.n_head = keys.required<uint32_t>("attention.head_count");
  hp.n_head_kv = keys.optional<uint32_t>("attention.head_count_kv").value_or(hp.n_head);
  hp.n_ctx_train = keys.required<uint32_t>("context_length");
  hp.rms_eps = keys.required<float>("attention.layer_norm_rms_epsilon");
  hp.rope_freq_base = keys.optional<float>("rope.freq_base").value_or(10000.0f);

  const auto key = [&](std::string_view suffix) { return arch_key(arch, suffix); };
  const auto show = [](uint32_t v) { return std::to_string(v); };
  if (hp.n_layer == 0) inconsistent(key("block_count") + " is 0");
  if (hp.n_embd == 0) inconsistent(key("embedding_length") + " is 0");
  if (hp.n_ff == 0) inconsistent(key("feed_forward_length") + " is 0");
  if (hp.n_head == 0) inconsistent(key("attention.head_count") + " is 0");
  if (hp.n_head_kv == 0 || hp.n_head % hp.n_head_kv != 0) {
    inconsistent(key("attention.head_count_kv") + " (" + show(hp.n_head_kv) + ") does not divide " +
                 key("attention.head_count") + " (" + show(hp.n_head) + ")");
  }

  if (auto k = keys.optional<uint32_t>("attention.key_length")) {
    hp.n_embd_head = *k;
    if (hp.n_embd_head == 0) inconsistent(key("attention.key_length") + " is 0");
  } else {
    if (hp.n_embd % hp.n_head != 0) {
      inconsistent(key("embedding_length") + " (" + show(hp.n_embd) + ") is not a multiple of " +
                   key("attention.head_count") + " (" + show(hp.n_head) + ")");
    }
    hp.n_embd_head = hp.n_embd / hp.n_head;
  }
  if (auto v = keys.optional<uint32_t>("attention.value_length"); v && *v != hp.n_embd_head) {
    inconsistent(key("attention.value_length") + " (" + show(*v) + ") differs from the key length (" +
                 show(hp.n_embd_head) + "), which m40-llm does not support");
  }

  // The query projection is n_head * head_dim wide: in 32 bits a crafted file
  // wraps it to a small width (even 0) that its tensors then match. The
  // key/value width is at most this, as head_count_kv divides head_count.
  if (const uint64_t width = uint64_t{hp.n_head} * hp.n_embd_head; width > kMaxProjectionWidth) {
    inconsistent(key("attention.head_count") + " (" + show(hp.n_head) + ") times the head dimension (" +
                 show(hp.n_embd_head) + ", " + key("attention.key_length") + ") gives a query width of " +
                 std::to_string(width) + ", above the " + std::to_string(kMaxProjectionWidth) +
                 " m40-llm supports");
  }

  hp.n_rot = keys.optional<uint32_t>("rope.dimension_count").value_or(hp.n_embd_head);
  if (hp.n_rot == 0 || hp.n_rot % 2 != 0 || hp.n_rot > hp.n_embd_head) {
    inconsistent(key("rope.dimension_count") + " (" + show(hp.n_rot) +
                 ") must be even and at most the head dimension (" + show(hp.n_embd_head) + ")");
  }
  if (!(hp.rope_freq_base > 0.0f) || !std::isfinite(hp.rope_freq_base)) {
    inconsistent(key("rope.freq_base") + " must be a positive number");
  }
  if (!(hp.rms_eps > 0.0f) || !std::isfinite(hp.rms_eps)) {
    inconsistent(key("attention.layer_norm_rms_epsilon") + " must be a positive number");
  }

  if (auto type = keys.optional<std::string>("rope.scaling.type")) {
    auto scaling = rope_scaling_from_name(*type);
    if (!scaling) {
      inconsistent(key("rope.scaling.type") + " = \"" + *type +
                   "\" is not one of none, linear, yarn, longrope");
    }
    hp.rope_scaling = *scaling;
  }
  if (auto factor = keys.optional<float>("rope.scaling.factor")) {
    if (!(*factor > 0.0f) || !std::isfinite(*factor)) {
      inconsistent(key("rope.scaling.factor") + " must be a positive number");
    }
    hp.rope_scaling_factor = *factor;
    // Older files give only a factor; llama.cpp reads that as linear scaling.
    if (!metadata.contains(key("rope.scaling.type")) && *factor != 1.0f) hp.rope_scaling = RopeScaling::Linear;
  }
  if (auto linear = keys.optional<float>("rope.scale_linear");
      linear && !metadata.contains(key("rope.scaling.factor"))) {
    // The key older converters wrote for linear scaling.
    if (!(*linear > 0.0f) || !std::isfinite(*linear)) inconsistent(key("rope.scale_linear") + " must be a positive number");
    hp.rope_scaling_factor = *linear;
    if (*linear != 1.0f) hp.rope_scaling = RopeScaling::Linear;
  }
  hp.rope_scaling_orig_ctx = keys.optional<uint32_t>("rope.scaling.original_context_length").value_or(0);

  hp.n_vocab = vocabulary_size(metadata, keys, arch, token_embd);
  if (hp.n_vocab == 0) inconsistent("the vocabulary of " + arch + " model is empty");
  return hp;
}

LlamaHparams LlamaHparams::from_file(const gguf::File& file) {
  return from_metadata(file.metadata(), file.find_tensor("token_embd.weight"));
}

}  // namespace m40::model
