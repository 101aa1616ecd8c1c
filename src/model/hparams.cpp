#include "model/hparams.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <iterator>
#include <numbers>
#include <variant>

#include "gguf/file.h"

namespace m40::model {

namespace {

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

constexpr std::string_view kPoolingNames[] = {"none", "mean", "cls", "last", "rank"};

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

// Reads the keys of the architecture's features and resolves them into the
// values the forward pass applies, with llama.cpp's defaults.
void resolve_features(ModelHparams& hp, const KeyReader& keys) {
  const Architecture& a = *hp.desc;
  const auto key = [&](std::string_view suffix) { return arch_key(hp.architecture, suffix); };
  const auto positive = [&](std::string_view suffix, float value) {
    if (!(value > 0.0f) || !std::isfinite(value)) inconsistent(key(suffix) + " must be a positive number");
    return value;
  };
  const auto finite = [&](std::string_view suffix, float value) {
    if (!std::isfinite(value)) inconsistent(key(suffix) + " must be a finite number");
    return value;
  };
  finite("rope.scaling.attn_factor", hp.rope_attn_factor);

  // Scales.
  hp.attention_scale = 1.0f / std::sqrt(static_cast<float>(hp.n_embd_head));
  if (a.embedding_scale_sqrt_n_embd) hp.embedding_scale = std::sqrt(static_cast<float>(hp.n_embd));
  if (a.gemma_attention_scale) {
    // Gemma 2 and 3 27B scale by 1/sqrt(n_embd / n_head) (gemma_pytorch's
    // query_pre_attn_scalar); llama.cpp recognises them by their layer count.
    const bool is_27b = (a.name == "gemma2" && hp.n_layer == 46) || (a.name == "gemma3" && hp.n_layer == 62);
    if (is_27b) hp.attention_scale = 1.0f / std::sqrt(static_cast<float>(hp.n_embd / hp.n_head));
  }
  if (a.granite_multipliers) {
    // llama.cpp reads these as 0 when absent, and 0 means "off".
    if (auto v = keys.optional<float>("embedding_scale"); v && *v != 0.0f) {
      hp.embedding_scale = finite("embedding_scale", *v);
    }
    if (auto v = keys.optional<float>("residual_scale"); v && *v != 0.0f) {
      hp.residual_scale = finite("residual_scale", *v);
    }
    if (auto v = keys.optional<float>("attention.scale"); v && *v != 0.0f) {
      hp.attention_scale = finite("attention.scale", *v);
    }
    const float logit_divisor = keys.required<float>("logit_scale");
    if (logit_divisor != 0.0f) hp.logit_scale = 1.0f / positive("logit_scale", logit_divisor);
  }
  if (a.attention_softcap) {
    hp.attn_softcap = keys.optional<float>("attn_logit_softcapping").value_or(50.0f);
    if (hp.attn_softcap != 0.0f) positive("attn_logit_softcapping", hp.attn_softcap);
  }
  if (a.reads_final_softcap) {
    hp.final_softcap = keys.optional<float>("final_logit_softcapping").value_or(a.default_final_softcap);
    if (hp.final_softcap != 0.0f) positive("final_logit_softcapping", hp.final_softcap);
  }
  if (a.attention_temperature) {
    hp.attn_temperature_scale = finite("attention.temperature_scale",
                                       keys.optional<float>("attention.temperature_scale").value_or(0.0f));
    if (hp.attn_temperature_scale != 0.0f) hp.attn_temperature_length = hp.rope_scaling_orig_ctx;
  }

  // Sliding windows.
  hp.swa_layers.assign(hp.n_layer, 0);
  uint32_t pattern = 0;
  if (a.sliding_window == SlidingWindow::Gemma2) {
    hp.sliding_window = keys.optional<uint32_t>("attention.sliding_window").value_or(4096);
    pattern = keys.optional<uint32_t>("attention.sliding_window_pattern").value_or(2);
  } else if (a.sliding_window == SlidingWindow::Gemma3) {
    hp.sliding_window = keys.optional<uint32_t>("attention.sliding_window").value_or(0);
    if (hp.sliding_window > 0) pattern = keys.optional<uint32_t>("attention.sliding_window_pattern").value_or(6);
  }
  if (hp.sliding_window > 0) {
    // llama.cpp's set_swa_pattern: a pattern of 0 makes every layer local.
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
      hp.swa_layers[il] = pattern == 0 || il % pattern < pattern - 1 ? 1 : 0;
    }
  }

  // RoPE: which layers apply it, and how each kind of layer scales it.
  bool rope_on = true;
  if (a.rope_switch) rope_on = keys.optional<bool>("rope.scaling.finetuned").value_or(true);
  hp.rope_layers.assign(hp.n_layer, rope_on ? 1 : 0);
  if (a.no_rope_layer_step > 0) {
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
      if ((il + 1) % a.no_rope_layer_step == 0) hp.rope_layers[il] = 0;
    }
  }
  if (a.yarn_keys) {
    hp.yarn_beta_fast = finite("rope.scaling.yarn_beta_fast",
                               keys.optional<float>("rope.scaling.yarn_beta_fast").value_or(hp.yarn_beta_fast));
    hp.yarn_beta_slow = finite("rope.scaling.yarn_beta_slow",
                               keys.optional<float>("rope.scaling.yarn_beta_slow").value_or(hp.yarn_beta_slow));
    hp.yarn_log_multiplier = finite("rope.scaling.yarn_log_multiplier",
                                    keys.optional<float>("rope.scaling.yarn_log_multiplier").value_or(0.0f));
  }

  // As llama_context sets up its parameters: the scale is 1 / factor unless
  // the type is none; YaRN mixes extrapolated and interpolated angles and
  // sets the magnitude; rope.scaling.attn_factor multiplies it in every case.
  RopeSettings& g = hp.rope_global;
  g.freq_base = hp.rope_freq_base;
  g.freq_scale = hp.rope_scaling == RopeScaling::None ? 1.0f : 1.0f / hp.rope_scaling_factor;
  g.ext_factor = hp.rope_scaling == RopeScaling::Yarn ? 1.0f : 0.0f;
  float attn_factor = 1.0f;
  if (g.ext_factor != 0.0f) {
    const float factor = 1.0f / g.freq_scale;
    const auto mscale = [&](float m) { return factor <= 1.0f ? 1.0f : 0.1f * m * std::log(factor) + 1.0f; };
    attn_factor = hp.yarn_log_multiplier != 0.0f ? mscale(1.0f) / mscale(hp.yarn_log_multiplier) : mscale(1.0f);
    attn_factor *= 1.0f / (1.0f + 0.1f * std::log(factor));
  }
  attn_factor *= hp.rope_attn_factor;

  hp.rope_local = g;
  if (a.sliding_window == SlidingWindow::Gemma2) {
    hp.rope_local.freq_base = keys.optional<float>("rope.freq_base_swa").value_or(hp.rope_freq_base);
  } else if (a.sliding_window == SlidingWindow::Gemma3) {
    hp.rope_local.freq_base = keys.optional<float>("rope.freq_base_swa").value_or(10000.0f);
    hp.rope_local.freq_scale = 1.0f;
  }
  positive("rope.freq_base_swa", hp.rope_local.freq_base);

  for (RopeSettings* r : {&hp.rope_global, &hp.rope_local}) {
    // ggml_rope_yarn_corr_dims: the pairs that turn beta_fast and beta_slow
    // times over the original context bound the ramp.
    const float n_rot = static_cast<float>(hp.n_rot);
    const float orig = static_cast<float>(hp.rope_scaling_orig_ctx);
    const auto corr_dim = [&](float beta) {
      return n_rot * std::log(orig / (beta * 2.0f * std::numbers::pi_v<float>)) / (2.0f * std::log(r->freq_base));
    };
    r->corr_low = std::max(0.0f, std::floor(corr_dim(hp.yarn_beta_fast)));
    r->corr_high = std::min(n_rot - 1.0f, std::ceil(corr_dim(hp.yarn_beta_slow)));
    // ggml's rope_yarn multiplies YaRN's magnitude back in.
    r->magnitude = attn_factor * (r->ext_factor != 0.0f ? 1.0f + 0.1f * std::log(1.0f / r->freq_scale) : 1.0f);
  }
}

}  // namespace

RopeSettings ModelHparams::rope_for_layer(uint32_t layer) const {
  RopeSettings r = is_swa_layer(layer) ? rope_local : rope_global;
  r.enabled = rope_layers[layer] != 0;
  return r;
}

float ModelHparams::attention_temperature(int32_t position) const {
  if (attn_temperature_scale == 0.0f) return 1.0f;
  const double steps = std::floor(static_cast<double>(position) / attn_temperature_length);
  return static_cast<float>(std::log(steps + 1.0) * attn_temperature_scale + 1.0);
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

std::string_view pooling_type_name(PoolingType pooling) {
  const auto i = static_cast<size_t>(pooling);
  return i < std::size(kPoolingNames) ? kPoolingNames[i] : "unknown";
}

std::string arch_key(std::string_view architecture, std::string_view suffix) {
  std::string key(architecture);
  key += '.';
  key += suffix;
  return key;
}

ModelHparams ModelHparams::from_metadata(const gguf::Metadata& metadata, const gguf::TensorInfo* token_embd) {
  ModelHparams hp;
  if (!metadata.contains("general.architecture")) {
    throw HparamsError("metadata key 'general.architecture' is missing");
  }
  try {
    hp.architecture = metadata.get<std::string>("general.architecture");
  } catch (const gguf::MetadataError& e) {
    throw HparamsError(e.what());
  }
  hp.desc = find_architecture(hp.architecture);
  if (hp.desc == nullptr) {
    throw HparamsError("unsupported architecture " + hp.architecture + " (general.architecture): m40-llm knows " +
                       std::string(known_architecture_list()));
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
  hp.rope_scaling_orig_ctx =
      keys.optional<uint32_t>("rope.scaling.original_context_length").value_or(hp.n_ctx_train);
  if (hp.rope_scaling_orig_ctx == 0) hp.rope_scaling_orig_ctx = hp.n_ctx_train;
  hp.rope_attn_factor = keys.optional<float>("rope.scaling.attn_factor").value_or(1.0f);
  hp.n_expert = keys.optional<uint32_t>("expert_count").value_or(0);
  hp.n_expert_used = keys.optional<uint32_t>("expert_used_count").value_or(0);
  if (hp.desc->experts_required && hp.n_expert == 0) inconsistent(key("expert_count") + " is missing or 0");
  if (hp.n_expert > 0) {
    // llama.cpp's LLAMA_MAX_EXPERTS.
    if (hp.n_expert > 512) inconsistent(key("expert_count") + " = " + show(hp.n_expert) + " exceeds 512");
    if (hp.n_expert_used == 0 || hp.n_expert_used > hp.n_expert) {
      inconsistent(key("expert_used_count") + " = " + show(hp.n_expert_used) + " must be between 1 and " +
                   key("expert_count") + " = " + show(hp.n_expert));
    }
    hp.n_ff_expert = hp.n_ff;
    if (hp.desc->reads_expert_ff_length) {
      hp.n_ff_expert = keys.optional<uint32_t>("expert_feed_forward_length").value_or(0);
      if (hp.n_ff_expert == 0) hp.n_ff_expert = hp.n_ff / hp.n_expert_used;
    }
    if (hp.n_ff_expert == 0) inconsistent(key("expert_feed_forward_length") + " is 0");
    if (hp.desc->shared_expert) {
      hp.n_ff_shared_expert = keys.optional<uint32_t>("expert_shared_feed_forward_length").value_or(0);
      if (hp.n_ff_shared_expert == 0) hp.n_ff_shared_expert = hp.n_ff;
      if (hp.n_ff_shared_expert == 0) inconsistent(key("expert_shared_feed_forward_length") + " is 0");
    }
  } else {
    hp.n_expert_used = 0;
  }
  if (auto pooling = keys.optional<uint32_t>("pooling_type")) {
    if (*pooling >= std::size(kPoolingNames)) {
      inconsistent(key("pooling_type") + " = " + show(*pooling) +
                   " is not one of 0 (none), 1 (mean), 2 (cls), 3 (last), 4 (rank)");
    }
    hp.pooling = static_cast<PoolingType>(*pooling);
  }
  // Bidirectional attention (BERT-like embedding models) is not built: the
  // attention is causal everywhere.
  if (keys.optional<bool>("attention.causal").value_or(true) == false) {
    inconsistent(key("attention.causal") + " is false: m40-llm runs causal attention only (non-causal embedding "
                 "models are not supported)");
  }
  resolve_features(hp, keys);

  hp.n_vocab = vocabulary_size(metadata, keys, arch, token_embd);
  if (hp.n_vocab == 0) inconsistent("the vocabulary of " + arch + " model is empty");
  return hp;
}

ModelHparams ModelHparams::from_file(const gguf::File& file) {
  return from_metadata(file.metadata(), file.find_tensor("token_embd.weight"));
}

}  // namespace m40::model
