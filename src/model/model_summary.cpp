#include "model/model_summary.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <map>
#include <variant>

#include "gguf/file.h"
#include "model/decode_reads.h"
#include "model/hparams.h"
#include "model/weights.h"

namespace m40::model {

namespace {

// enum llama_ftype in llama.cpp's include/llama.h; ids 4-6 and 33-35 are
// formats llama.cpp has since removed, kept so that old files still get a name.
struct FileTypeName {
  uint32_t id;
  std::string_view name;
};
constexpr FileTypeName kFileTypes[] = {
    {0, "ALL_F32"},         {1, "MOSTLY_F16"},        {2, "MOSTLY_Q4_0"},       {3, "MOSTLY_Q4_1"},
    {4, "MOSTLY_Q4_1_SOME_F16"}, {5, "MOSTLY_Q4_2"},  {6, "MOSTLY_Q4_3"},       {7, "MOSTLY_Q8_0"},
    {8, "MOSTLY_Q5_0"},     {9, "MOSTLY_Q5_1"},       {10, "MOSTLY_Q2_K"},      {11, "MOSTLY_Q3_K_S"},
    {12, "MOSTLY_Q3_K_M"},  {13, "MOSTLY_Q3_K_L"},    {14, "MOSTLY_Q4_K_S"},    {15, "MOSTLY_Q4_K_M"},
    {16, "MOSTLY_Q5_K_S"},  {17, "MOSTLY_Q5_K_M"},    {18, "MOSTLY_Q6_K"},      {19, "MOSTLY_IQ2_XXS"},
    {20, "MOSTLY_IQ2_XS"},  {21, "MOSTLY_Q2_K_S"},    {22, "MOSTLY_IQ3_XS"},    {23, "MOSTLY_IQ3_XXS"},
    {24, "MOSTLY_IQ1_S"},   {25, "MOSTLY_IQ4_NL"},    {26, "MOSTLY_IQ3_S"},     {27, "MOSTLY_IQ3_M"},
    {28, "MOSTLY_IQ2_S"},   {29, "MOSTLY_IQ2_M"},     {30, "MOSTLY_IQ4_XS"},    {31, "MOSTLY_IQ1_M"},
    {32, "MOSTLY_BF16"},    {33, "MOSTLY_Q4_0_4_4"},  {34, "MOSTLY_Q4_0_4_8"},  {35, "MOSTLY_Q4_0_8_8"},
    {36, "MOSTLY_TQ1_0"},   {37, "MOSTLY_TQ2_0"},     {38, "MOSTLY_MXFP4_MOE"}, {39, "MOSTLY_NVFP4"},
    {40, "MOSTLY_Q1_0"},
};
constexpr uint32_t kFileTypeGuessed = 1024;  // LLAMA_FTYPE_GUESSED

// The special tokens llama.cpp reads (the separator key keeps llama.cpp's spelling).
struct SpecialTokenKey {
  std::string_view label;
  std::string_view key;
};
constexpr SpecialTokenKey kSpecialTokens[] = {
    {"BOS", "tokenizer.ggml.bos_token_id"},     {"EOS", "tokenizer.ggml.eos_token_id"},
    {"EOT", "tokenizer.ggml.eot_token_id"},     {"EOM", "tokenizer.ggml.eom_token_id"},
    {"UNK", "tokenizer.ggml.unknown_token_id"}, {"SEP", "tokenizer.ggml.seperator_token_id"},
    {"PAD", "tokenizer.ggml.padding_token_id"}, {"CLS", "tokenizer.ggml.cls_token_id"},
    {"MASK", "tokenizer.ggml.mask_token_id"},
};

struct TokenizerKind {
  std::string_view model;
  std::string_view kind;
};
constexpr TokenizerKind kTokenizerKinds[] = {
    {"llama", "SentencePiece"}, {"gpt2", "BPE"}, {"bert", "WordPiece"},
    {"t5", "Unigram"},          {"rwkv", "RWKV"}, {"plamo2", "PLaMo-2"},
    {"no_vocab", "none"},
};

// A value of the wanted type, or nothing when it is absent or of another
// type: `show` describes what it can and never fails on odd metadata.
template <class T> std::optional<T> lenient(const gguf::Metadata& metadata, std::string_view key) {
  try {
    return metadata.get_optional<T>(key);
  } catch (const gguf::MetadataError&) {
    return std::nullopt;
  }
}

std::optional<double> lenient_float(const gguf::Metadata& metadata, std::string_view key) {
  const gguf::Value* v = metadata.find(key);
  return v == nullptr ? std::nullopt : metadata_float(*v);
}

const gguf::Array* find_array(const gguf::Metadata& metadata, std::string_view key) {
  const gguf::Value* v = metadata.find(key);
  return v == nullptr ? nullptr : std::get_if<gguf::Array>(&v->storage);
}

std::string hex_escape(unsigned char c) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\x%02x", c);
  return buf;
}

// Cuts at most `max_bytes` without splitting a UTF-8 sequence.
size_t utf8_cut(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text.size();
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return cut;
}

std::string escape(std::string_view text, bool escape_quotes) {
  std::string out;
  out.reserve(text.size());
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\\': out += "\\\\"; break;
      case '"':
        out += escape_quotes ? "\\\"" : "\"";
        break;
      default:
        if (c < 0x20 || c == 0x7F) {
          out += hex_escape(c);
        } else {
          out += ch;
        }
    }
  }
  return out;
}

}  // namespace

std::optional<std::string> file_type_name(uint32_t file_type) {
  const bool guessed = (file_type & kFileTypeGuessed) != 0;
  const uint32_t id = file_type & ~kFileTypeGuessed;
  for (const auto& f : kFileTypes) {
    if (f.id == id) return std::string(f.name) + (guessed ? " (guessed)" : "");
  }
  return std::nullopt;
}

std::string format_parameter_count(uint64_t count) {
  struct Unit {
    double scale;
    const char* suffix;
    int decimals;
  };
  constexpr Unit kUnits[] = {{1e12, "T", 2}, {1e9, "B", 2}, {1e6, "M", 1}, {1e3, "K", 1}};
  for (const auto& u : kUnits) {
    // Round first, so 999,960 reads 1.0M and not 1000.0K.
    if (static_cast<double>(count) >= u.scale * (1.0 - 0.5 / 1000.0)) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.*f%s", u.decimals, static_cast<double>(count) / u.scale, u.suffix);
      return buf;
    }
  }
  return std::to_string(count);
}

std::string format_bytes(uint64_t bytes) {
  constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes) / 1024.0;
  size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", value, kUnits[unit]);
  return buf;
}

std::string format_float(double value) {
  std::array<char, 64> buf{};
  auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), value);
  if (ec != std::errc()) return std::to_string(value);
  return std::string(buf.data(), end);
}

std::optional<double> metadata_float(const gguf::Value& value) {
  if (const auto* d = std::get_if<double>(&value.storage)) return *d;
  if (const auto* f = std::get_if<float>(&value.storage)) {
    std::array<char, 64> buf{};
    auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), *f);
    double d = static_cast<double>(*f);
    if (ec == std::errc()) std::from_chars(buf.data(), end, d);
    return d;
  }
  return std::nullopt;
}

std::string escape_for_display(std::string_view text, size_t max_bytes) {
  const size_t cut = utf8_cut(text, max_bytes);
  std::string out = escape(text.substr(0, cut), false);
  if (cut < text.size()) out += "...";
  return out;
}

std::string format_metadata_value(const gguf::Value& value, size_t max_items, size_t max_string_bytes) {
  return std::visit(
      [&](const auto& v) -> std::string {
        using S = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<S, std::string>) {
          const size_t cut = utf8_cut(v, max_string_bytes);
          std::string out = "\"";
          out += escape(std::string_view(v).substr(0, cut), true);
          out += '"';
          if (cut < v.size()) out += "... (" + std::to_string(v.size()) + " bytes)";
          return out;
        } else if constexpr (std::is_same_v<S, bool>) {
          return v ? "true" : "false";
        } else if constexpr (std::is_floating_point_v<S>) {
          return format_float(*metadata_float(value));
        } else if constexpr (std::is_same_v<S, gguf::Array>) {
          std::string out = "[";
          for (size_t i = 0; i < v.items.size() && i < max_items; ++i) {
            if (i > 0) out += ", ";
            out += format_metadata_value(v.items[i], max_items, max_string_bytes);
          }
          if (v.items.size() > max_items) {
            out += ", ... (" + std::to_string(v.items.size()) + " " +
                   std::string(gguf::value_type_name(v.element_type)) + " items)";
          }
          return out + "]";
        } else if constexpr (std::is_same_v<S, int8_t> || std::is_same_v<S, uint8_t>) {
          return std::to_string(static_cast<int>(v));
        } else {
          return std::to_string(v);
        }
      },
      value.storage);
}

std::optional<double> ModelSummary::bits_per_weight() const {
  if (parameter_count == 0) return std::nullopt;
  return static_cast<double>(tensor_bytes) * 8.0 / static_cast<double>(parameter_count);
}

const SpecialToken* ModelSummary::special_token(std::string_view label) const {
  for (const auto& t : special_tokens) {
    if (t.label == label) return &t;
  }
  return nullptr;
}

std::string_view tokenizer_kind(std::string_view tokenizer_model) {
  for (const auto& k : kTokenizerKinds) {
    if (k.model == tokenizer_model) return k.kind;
  }
  return {};
}

ModelSummary summarize(const gguf::File& file) {
  const gguf::Metadata& md = file.metadata();
  ModelSummary s;
  s.path = file.path();
  s.file_size = file.total_size();  // every part of a split model
  s.gguf_version = file.version();
  s.alignment = file.alignment();
  s.data_offset = file.data_offset();
  s.metadata_count = md.size();
  s.tensor_count = file.tensors().size();

  s.architecture = lenient<std::string>(md, "general.architecture").value_or("");
  s.architecture_known = find_architecture(s.architecture) != nullptr;
  if (file.tensors().empty()) {
    s.not_runnable_reason = "the file holds no tensors (a vocabulary-only file)";
  } else {
    // Runnable means exactly what loading would say: the same reader and
    // checks, so show never promises what run then refuses.
    try {
      const ModelHparams hparams = ModelHparams::from_file(file);
      const ModelWeights weights = ModelWeights::load(file, hparams);
      s.architecture_runnable = true;
      if (hparams.has_experts()) s.expert_feed_forward_length = hparams.n_ff_expert;
      if (hparams.n_ff_shared_expert != 0) s.shared_expert_feed_forward_length = hparams.n_ff_shared_expert;
      s.unused_tensors = weights.unused_tensors;
    } catch (const std::exception& e) {
      s.not_runnable_reason = e.what();
    }
  }
  s.name = lenient<std::string>(md, "general.name");
  s.license = lenient<std::string>(md, "general.license");
  s.size_label = lenient<std::string>(md, "general.size_label");
  s.file_type = lenient<uint32_t>(md, "general.file_type");
  s.quantization_version = lenient<uint32_t>(md, "general.quantization_version");

  std::map<gguf::TensorType, TensorTypeStats> by_type;
  for (const auto& t : file.tensors()) {
    s.parameter_count += t.element_count;
    s.tensor_bytes += t.byte_size;
    auto& stats = by_type.try_emplace(t.type, TensorTypeStats{t.type}).first->second;
    ++stats.count;
    stats.elements += t.element_count;
    stats.bytes += t.byte_size;
  }
  for (const auto& [type, stats] : by_type) s.tensor_types.push_back(stats);
  std::stable_sort(s.tensor_types.begin(), s.tensor_types.end(),
                   [](const TensorTypeStats& a, const TensorTypeStats& b) { return a.elements > b.elements; });

  if (!s.architecture.empty()) {
    const auto key = [&](std::string_view suffix) { return arch_key(s.architecture, suffix); };
    s.context_length = lenient<uint64_t>(md, key("context_length"));
    s.embedding_length = lenient<uint64_t>(md, key("embedding_length"));
    s.block_count = lenient<uint64_t>(md, key("block_count"));
    s.feed_forward_length = lenient<uint64_t>(md, key("feed_forward_length"));
    s.head_count = lenient<uint64_t>(md, key("attention.head_count"));
    s.head_count_kv = lenient<uint64_t>(md, key("attention.head_count_kv"));
    if (!s.head_count_kv && s.head_count) s.head_count_kv = s.head_count;
    s.head_dim = lenient<uint64_t>(md, key("attention.key_length"));
    if (!s.head_dim && s.head_count && s.embedding_length && *s.head_count > 0 &&
        *s.embedding_length % *s.head_count == 0) {
      s.head_dim = *s.embedding_length / *s.head_count;
    }
    s.rope_dimension_count = lenient<uint64_t>(md, key("rope.dimension_count"));
    s.rope_freq_base = lenient_float(md, key("rope.freq_base"));
    s.rope_scaling_type = lenient<std::string>(md, key("rope.scaling.type"));
    s.rope_scaling_factor = lenient_float(md, key("rope.scaling.factor"));
    s.rope_scaling_original_context_length = lenient<uint64_t>(md, key("rope.scaling.original_context_length"));
    s.rms_norm_eps = lenient_float(md, key("attention.layer_norm_rms_epsilon"));
    s.layer_norm_eps = lenient_float(md, key("attention.layer_norm_epsilon"));
    s.vocab_size = lenient<uint64_t>(md, key("vocab_size"));
    s.pooling_type = lenient<uint64_t>(md, key("pooling_type"));
    s.expert_count = lenient<uint64_t>(md, key("expert_count"));
    if (s.has_experts()) {
      s.expert_used_count = lenient<uint64_t>(md, key("expert_used_count"));
      if (!s.expert_feed_forward_length) {
        s.expert_feed_forward_length = lenient<uint64_t>(md, key("expert_feed_forward_length"));
      }
      if (s.expert_used_count && *s.expert_used_count <= *s.expert_count) {
        uint64_t active = 0;
        for (const auto& t : file.tensors()) {
          const bool expert_slices = t.dims.size() == 3 && t.dims[2] == *s.expert_count &&
                                     t.name.ends_with("_exps.weight");
          active += expert_slices ? t.element_count / *s.expert_count * *s.expert_used_count : t.element_count;
        }
        s.active_parameter_count = active;
      }
    }
  }

  const gguf::Array* tokens = find_array(md, "tokenizer.ggml.tokens");
  if (tokens != nullptr) s.token_count = tokens->items.size();
  if (const gguf::Array* merges = find_array(md, "tokenizer.ggml.merges")) s.merge_count = merges->items.size();
  if (!s.vocab_size) s.vocab_size = s.token_count;
  const gguf::TensorInfo* token_embd = file.find_tensor("token_embd.weight");
  if (!s.vocab_size && token_embd != nullptr && token_embd->dims.size() >= 2) s.vocab_size = token_embd->dims[1];
  if (!file.tensors().empty()) {
    s.output_tied = file.find_tensor("output.weight") == nullptr;
    s.decode_bytes_per_token =
        decode_bytes_per_token(file, s.expert_count.value_or(0), s.expert_used_count.value_or(0));
  }

  s.tokenizer_model = lenient<std::string>(md, "tokenizer.ggml.model");
  s.tokenizer_pre = lenient<std::string>(md, "tokenizer.ggml.pre");
  for (const auto& special : kSpecialTokens) {
    auto id = lenient<int64_t>(md, special.key);
    if (!id) continue;
    SpecialToken token{special.label, special.key, *id, std::nullopt};
    if (tokens != nullptr && *id >= 0 && static_cast<uint64_t>(*id) < tokens->items.size()) {
      if (const auto* text = std::get_if<std::string>(&tokens->items[static_cast<size_t>(*id)].storage)) {
        token.text = *text;
      }
    }
    s.special_tokens.push_back(std::move(token));
  }
  s.add_bos = lenient<bool>(md, "tokenizer.ggml.add_bos_token");
  s.add_eos = lenient<bool>(md, "tokenizer.ggml.add_eos_token");
  if (const gguf::Value* tmpl = md.find("tokenizer.chat_template")) {
    s.has_chat_template = true;
    if (const auto* text = std::get_if<std::string>(&tmpl->storage)) s.chat_template_bytes = text->size();
  }
  return s;
}

}  // namespace m40::model
