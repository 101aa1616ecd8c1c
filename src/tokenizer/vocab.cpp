// Loading a Vocab from `tokenizer.*` metadata, with llama.cpp's defaults for
// what the file leaves out (llama_vocab::impl::load), and the encode entry
// point that dispatches to the SPM or BPE encoder.
#include "tokenizer/vocab.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <variant>

#include "gguf/file.h"
#include "gguf/metadata.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab_impl.h"

namespace m40::tokenizer {

namespace {

using gguf::Metadata;
using gguf::Value;

constexpr std::string_view kEscapedSpace = "\xE2\x96\x81";  // ▁ U+2581

const gguf::Array* find_array(const Metadata& md, std::string_view key) {
  const Value* v = md.find(key);
  if (v == nullptr) return nullptr;
  const auto* array = std::get_if<gguf::Array>(&v->storage);
  if (array == nullptr) {
    throw TokenizerError("metadata key '" + std::string(key) + "' should be an array, is " +
                         std::string(gguf::value_type_name(v->type())));
  }
  return array;
}

[[noreturn]] void bad_element(std::string_view key, size_t i, std::string_view wanted, const Value& v) {
  throw TokenizerError("metadata key '" + std::string(key) + "'[" + std::to_string(i) + "] is " +
                       std::string(gguf::value_type_name(v.type())) + ", expected " + std::string(wanted));
}

std::vector<std::string> string_array(const Metadata& md, std::string_view key) {
  std::vector<std::string> out;
  const gguf::Array* array = find_array(md, key);
  if (array == nullptr) return out;
  out.reserve(array->items.size());
  for (size_t i = 0; i < array->items.size(); ++i) {
    const auto* s = std::get_if<std::string>(&array->items[i].storage);
    if (s == nullptr) bad_element(key, i, "string", array->items[i]);
    out.push_back(*s);
  }
  return out;
}

// Scores are float32 in practice; llama.cpp also accepts int32.
std::vector<float> score_array(const Metadata& md, std::string_view key) {
  std::vector<float> out;
  const gguf::Array* array = find_array(md, key);
  if (array == nullptr) return out;
  out.reserve(array->items.size());
  for (size_t i = 0; i < array->items.size(); ++i) {
    const Value& v = array->items[i];
    if (const auto* f = std::get_if<float>(&v.storage)) {
      out.push_back(*f);
    } else if (const auto* n = std::get_if<int32_t>(&v.storage)) {
      out.push_back(static_cast<float>(*n));
    } else {
      bad_element(key, i, "float32 or int32", v);
    }
  }
  return out;
}

std::vector<int32_t> int_array(const Metadata& md, std::string_view key) {
  std::vector<int32_t> out;
  const gguf::Array* array = find_array(md, key);
  if (array == nullptr) return out;
  out.reserve(array->items.size());
  for (size_t i = 0; i < array->items.size(); ++i) {
    try {
      out.push_back(gguf::convert_value<int32_t>(array->items[i], key));
    } catch (const Error&) {
      bad_element(key, i, "int32", array->items[i]);
    }
  }
  return out;
}

std::optional<int64_t> optional_int(const Metadata& md, std::string_view key) {
  try {
    return md.get_optional<int64_t>(key);
  } catch (const Error& e) {
    throw TokenizerError(e.what());
  }
}

std::optional<bool> optional_bool(const Metadata& md, std::string_view key) {
  try {
    return md.get_optional<bool>(key);
  } catch (const Error& e) {
    throw TokenizerError(e.what());
  }
}

std::optional<std::string> optional_string(const Metadata& md, std::string_view key) {
  try {
    return md.get_optional<std::string>(key);
  } catch (const Error& e) {
    throw TokenizerError(e.what());
  }
}

uint16_t attr_of_type(int32_t type) {
  switch (static_cast<TokenType>(type)) {
    case TokenType::kUnknown: return kAttrUnknown;
    case TokenType::kUnused: return kAttrUnused;
    case TokenType::kNormal: return kAttrNormal;
    case TokenType::kControl: return kAttrControl;
    case TokenType::kUserDefined: return kAttrUserDefined;
    case TokenType::kByte: return kAttrByte;
    default: return kAttrUndefined;
  }
}

// Tokenizer models llama.cpp knows that this project does not implement yet.
std::string unsupported_model_message(const std::string& model) {
  if (model == "t5") return "Unigram vocabularies (tokenizer.ggml.model = \"t5\") are not supported yet";
  if (model == "rwkv" || model == "plamo2" || model == "gemma4" || model == "hybriddna" || model == "whitespace") {
    return "tokenizer.ggml.model = \"" + model + "\" is not supported yet; only \"llama\", \"gpt2\" and \"bert\"";
  }
  if (model == "no_vocab" || model == "none") return "this model has no vocabulary (tokenizer.ggml.model = \"" + model + "\")";
  return "unknown tokenizer.ggml.model \"" + model +
         "\"; supported: \"llama\" (SentencePiece), \"gpt2\" (byte-level BPE), \"bert\" (WordPiece)";
}

// Token texts that mark the end of a turn or of generation; llama.cpp finds
// them by name because converters do not always set the ids.
constexpr std::array<std::string_view, 10> kEndOfTurnNames = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>", "<EOT>", "_<EOT>", "<｜end▁of▁sentence｜>", "<end_of_utterance>"};
constexpr std::array<std::string_view, 13> kEndOfGenerationNames = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>",
    "_<EOT>", "<|end_of_text|>", "<end_of_utterance>", "<|return|>", "<|call|>", "<｜end▁of▁sentence｜>"};

}  // namespace

size_t& linear_merge_limit() {
  static size_t limit = 48;
  return limit;
}

std::string_view token_type_name(TokenType type) {
  switch (type) {
    case TokenType::kUndefined: return "undefined";
    case TokenType::kNormal: return "normal";
    case TokenType::kUnknown: return "unknown";
    case TokenType::kControl: return "control";
    case TokenType::kUserDefined: return "user-defined";
    case TokenType::kUnused: return "unused";
    case TokenType::kByte: return "byte";
  }
  return "undefined";
}

Vocab::Vocab(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Vocab::Vocab(Vocab&&) noexcept = default;
Vocab& Vocab::operator=(Vocab&&) noexcept = default;
Vocab::~Vocab() = default;

Vocab Vocab::from_file(const std::string& path) {
  gguf::File file = gguf::File::open(path);
  try {
    return from_metadata(file.metadata());
  } catch (const TokenizerError& e) {
    throw TokenizerError(path + ": " + e.what());
  }
}

Vocab Vocab::from_metadata(const Metadata& md) {
  auto impl = std::make_unique<Impl>();
  Impl& v = *impl;

  const std::optional<std::string> model = optional_string(md, "tokenizer.ggml.model");
  if (!model) throw TokenizerError("no vocabulary: metadata key 'tokenizer.ggml.model' is missing");
  v.model_name = *model;
  const std::optional<std::string> pre = optional_string(md, "tokenizer.ggml.pre");

  const PreTokenizerFlavour* flavour = nullptr;
  if (v.model_name == "llama") {
    v.kind = VocabKind::kSpm;
    v.special.bos = 1;
    v.special.eos = 2;
    v.special.unk = 0;
    v.add_space_prefix = true;
    v.clean_spaces = false;
    v.add_bos = true;
    v.add_eos = false;
    v.pre_name = pre.value_or("default");  // SentencePiece has no pre-tokenizer: ignored
  } else if (v.model_name == "gpt2") {
    v.kind = VocabKind::kBpe;
    v.special.bos = 11;
    v.special.eos = 11;
    if (!pre || pre->empty()) {
      flavour = find_pre_tokenizer_flavour("default");
      v.warnings.push_back("no tokenizer.ggml.pre: using the 'default' pre-tokenizer (as llama.cpp does); "
                           "words may be split differently from the original tokenizer");
    } else {
      flavour = find_pre_tokenizer_flavour(*pre);
      if (flavour == nullptr) {
        throw TokenizerError("unknown pre-tokenizer tokenizer.ggml.pre = \"" + *pre +
                             "\"; known: " + known_pre_tokenizer_names());
      }
    }
    v.pre_name = std::string(flavour->name);
    v.add_space_prefix = false;
    v.clean_spaces = flavour->clean_spaces;
    v.ignore_merges = flavour->ignore_merges;
    v.add_bos = flavour->add_bos.value_or(false);
    v.add_eos = false;
    if (flavour->no_default_bos) v.special.bos = kNoToken;
  } else if (v.model_name == "bert") {
    v.kind = VocabKind::kWpm;
    v.special.bos = 101;  // [CLS]
    v.special.unk = 100;
    v.special.sep = 102;
    v.special.pad = 0;
    v.special.mask = 103;
    v.add_space_prefix = false;
    v.clean_spaces = true;
    v.add_bos = true;
    v.add_eos = false;
    v.add_sep = true;
    v.pre_name = pre.value_or("default");  // WordPiece has no regex pre-tokenizer: ignored
    if (auto lower = optional_bool(md, "tokenizer.ggml.normalizer.lowercase")) v.wpm_lowercase = *lower;
    v.wpm_strip_accents = v.wpm_lowercase;
    if (auto strip = optional_bool(md, "tokenizer.ggml.normalizer.strip_accents")) v.wpm_strip_accents = *strip;
  } else {
    throw TokenizerError(unsupported_model_message(v.model_name));
  }
  if (auto prefix = optional_bool(md, "tokenizer.ggml.add_space_prefix")) v.add_space_prefix = *prefix;

  // Tokens, scores, types.
  std::vector<std::string> texts = string_array(md, "tokenizer.ggml.tokens");
  if (texts.empty()) throw TokenizerError("no vocabulary: metadata key 'tokenizer.ggml.tokens' is missing or empty");
  if (texts.size() >= static_cast<size_t>(INT32_MAX / 2)) throw TokenizerError("vocabulary too large");
  const std::vector<float> scores = score_array(md, "tokenizer.ggml.scores");
  const std::vector<int32_t> types = int_array(md, "tokenizer.ggml.token_type");
  const size_t n = texts.size();
  if (!scores.empty() && scores.size() < n) {
    throw TokenizerError("tokenizer.ggml.scores has " + std::to_string(scores.size()) + " entries for " +
                         std::to_string(n) + " tokens");
  }
  if (!types.empty() && types.size() < n) {
    throw TokenizerError("tokenizer.ggml.token_type has " + std::to_string(types.size()) + " entries for " +
                         std::to_string(n) + " tokens");
  }
  v.tokens.resize(n);
  v.token_to_id.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    TokenData& t = v.tokens[i];
    t.text = std::move(texts[i]);
    if (t.text.empty()) t.text = "[EMPTY_" + std::to_string(i) + "]";
    auto [it, inserted] = v.token_to_id.emplace(t.text, static_cast<TokenId>(i));
    if (!inserted) {
      throw TokenizerError("duplicate token in the vocabulary: ids " + std::to_string(it->second) + " and " +
                           std::to_string(i));
    }
    t.score = scores.empty() ? 0.0f : scores[i];
    t.type = types.empty() ? TokenType::kNormal : static_cast<TokenType>(types[i]);
    t.attr = types.empty() ? uint16_t{kAttrNormal} : attr_of_type(types[i]);
    v.max_token_len = std::max(v.max_token_len, t.text.size());
  }

  std::vector<std::string> merges;
  if (v.kind == VocabKind::kBpe) {
    merges = string_array(md, "tokenizer.ggml.merges");
    if (md.find("tokenizer.ggml.merges") == nullptr) {
      throw TokenizerError("BPE vocabulary without merges: metadata key 'tokenizer.ggml.merges' is missing");
    }
  }

  // Special token ids: llama.cpp's defaults, overridden by the file. An id
  // outside the vocabulary disables a default and is ignored in the file.
  auto within = [&](int64_t id) { return id >= 0 && static_cast<size_t>(id) < n; };
  struct IdKey {
    std::string_view key;
    TokenId* id;
  };
  const IdKey id_keys[] = {
      {"tokenizer.ggml.bos_token_id", &v.special.bos},     {"tokenizer.ggml.eos_token_id", &v.special.eos},
      {"tokenizer.ggml.eot_token_id", &v.special.eot},     {"tokenizer.ggml.eom_token_id", &v.special.eom},
      {"tokenizer.ggml.unknown_token_id", &v.special.unk}, {"tokenizer.ggml.seperator_token_id", &v.special.sep},
      {"tokenizer.ggml.separator_token_id", &v.special.sep}, {"tokenizer.ggml.padding_token_id", &v.special.pad},
      {"tokenizer.ggml.mask_token_id", &v.special.mask},
      {"tokenizer.ggml.prefix_token_id", &v.special.fim_pre}, {"tokenizer.ggml.suffix_token_id", &v.special.fim_suf},
      {"tokenizer.ggml.middle_token_id", &v.special.fim_mid}, {"tokenizer.ggml.fim_pre_token_id", &v.special.fim_pre},
      {"tokenizer.ggml.fim_suf_token_id", &v.special.fim_suf}, {"tokenizer.ggml.fim_mid_token_id", &v.special.fim_mid},
  };
  for (const IdKey& k : id_keys) {
    if (*k.id != kNoToken && !within(*k.id)) *k.id = kNoToken;
    const std::optional<int64_t> value = optional_int(md, k.key);
    if (!value) continue;
    if (within(*value)) {
      *k.id = static_cast<TokenId>(*value);
    } else {
      v.warnings.push_back(std::string(k.key) + " = " + std::to_string(*value) + " is outside the vocabulary; ignored");
    }
  }
  if (auto b = optional_bool(md, "tokenizer.ggml.add_bos_token")) v.add_bos = *b;
  if (auto e = optional_bool(md, "tokenizer.ggml.add_eos_token")) v.add_eos = *e;
  if (v.add_bos && v.special.bos == kNoToken) {
    throw TokenizerError("tokenizer.ggml.add_bos_token is true but the vocabulary has no BOS token");
  }
  if (v.add_eos && v.special.eos == kNoToken) {
    throw TokenizerError("tokenizer.ggml.add_eos_token is true but the vocabulary has no EOS token");
  }
  if (auto s = optional_bool(md, "tokenizer.ggml.add_sep_token"); s && v.kind == VocabKind::kWpm) v.add_sep = *s;
  if (v.kind == VocabKind::kWpm && (v.special.unk == kNoToken || (v.add_sep && v.special.sep == kNoToken))) {
    throw TokenizerError("WordPiece vocabulary without an UNK or a SEP token");
  }

  // End of turn / generation by name; such tokens are control tokens even
  // where a converter marked them otherwise (as in llama.cpp).
  v.end_of_generation.assign(n, false);
  for (std::string_view name : kEndOfTurnNames) {
    if (v.special.eot != kNoToken) break;
    if (TokenId id = v.lookup(name); id != kNoToken) {
      v.special.eot = id;
      v.tokens[id].attr |= kAttrControl;
    }
  }
  if (v.special.eom == kNoToken) {
    if (TokenId id = v.lookup("<|eom_id|>"); id != kNoToken) {
      v.special.eom = id;
      v.tokens[id].attr |= kAttrControl;
    }
  }
  // Fill-in-the-middle markers by name where the file names none (older
  // conversions do not); as llama.cpp, they are control tokens.
  struct FimNames {
    TokenId* id;
    std::initializer_list<std::string_view> names;
  };
  const FimNames fim_names[] = {
      {&v.special.fim_pre, {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>"}},
      {&v.special.fim_suf, {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>"}},
      {&v.special.fim_mid, {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>"}},
  };
  for (const FimNames& f : fim_names) {
    for (std::string_view name : f.names) {
      if (*f.id != kNoToken) break;
      if (TokenId id = v.lookup(name); id != kNoToken) *f.id = id;
    }
    if (*f.id != kNoToken) v.tokens[*f.id].attr |= kAttrControl;
  }
  for (std::string_view name : kEndOfGenerationNames) {
    if (TokenId id = v.lookup(name); id != kNoToken) {
      v.end_of_generation[id] = true;
      v.tokens[id].attr |= kAttrControl;
    }
  }
  for (TokenId id : {v.special.eos, v.special.eot, v.special.eom}) {
    if (id != kNoToken) v.end_of_generation[id] = true;
  }
  for (TokenId id = 0; id < static_cast<TokenId>(n); ++id) {
    if (v.end_of_generation[id]) v.end_of_generation_ids.push_back(id);
  }

  v.build_special_index();

  // Phi-3's special tokens swallow the spaces after them (llama.cpp sets this
  // by model name; the file does not say).
  std::string general_name = optional_string(md, "general.name").value_or("");
  std::transform(general_name.begin(), general_name.end(), general_name.begin(),
                 [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); });
  if (general_name.find("phi-3") != std::string::npos || general_name.find("phi3") != std::string::npos) {
    for (TokenId id : v.special_tokens) v.tokens[id].attr |= kAttrRstrip;
    if (TokenId id = v.lookup("</s>"); id != kNoToken) v.tokens[id].attr |= kAttrRstrip;
    for (std::string_view name : {"<unk>", "<s>", "<|endoftext|>"}) {
      if (TokenId id = v.lookup(name); id != kNoToken) v.tokens[id].attr &= static_cast<uint16_t>(~kAttrRstrip);
    }
  }

  v.build_pieces();
  if (v.kind == VocabKind::kSpm) {
    v.build_spm();
  } else if (v.kind == VocabKind::kBpe) {
    v.pre_tokenizer = std::make_unique<PreTokenizer>(*flavour);
    v.build_bpe(merges);
  }

  Vocab vocab(std::move(impl));
  // The newline token, as llama.cpp finds it.
  if (vocab.impl_->kind == VocabKind::kSpm) {
    vocab.impl_->special.newline = vocab.impl_->spm.byte_token['\n'];
    if (vocab.impl_->special.newline == kNoToken) vocab.impl_->special.newline = vocab.impl_->special.pad;
  } else if (vocab.impl_->kind == VocabKind::kWpm) {
    vocab.impl_->special.newline = vocab.impl_->special.pad;  // as llama.cpp
  } else {
    const std::vector<TokenId> ids = vocab.encode("\n", {.add_special = false, .parse_special = false});
    vocab.impl_->special.newline = ids.empty() ? vocab.impl_->special.pad : ids[0];
  }
  return vocab;
}

VocabKind Vocab::kind() const { return impl_->kind; }
const std::string& Vocab::model_name() const { return impl_->model_name; }
const std::string& Vocab::pre_name() const { return impl_->pre_name; }
const std::vector<std::string>& Vocab::warnings() const { return impl_->warnings; }
size_t Vocab::size() const { return impl_->tokens.size(); }

void Vocab::check_id(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->tokens.size()) {
    throw TokenizerError("token id " + std::to_string(id) + " is out of range: the vocabulary has " +
                         std::to_string(impl_->tokens.size()) + " tokens (ids 0.." +
                         std::to_string(impl_->tokens.size() - 1) + ")");
  }
}

const std::string& Vocab::text(TokenId id) const {
  check_id(id);
  return impl_->tokens[id].text;
}
float Vocab::score(TokenId id) const {
  check_id(id);
  return impl_->tokens[id].score;
}
TokenType Vocab::type(TokenId id) const {
  check_id(id);
  return impl_->tokens[id].type;
}
bool Vocab::is_control(TokenId id) const {
  check_id(id);
  return (impl_->tokens[id].attr & (kAttrControl | kAttrUnknown)) != 0;
}
bool Vocab::is_end_of_generation(TokenId id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->end_of_generation.size() && impl_->end_of_generation[id];
}
const std::vector<TokenId>& Vocab::end_of_generation_tokens() const { return impl_->end_of_generation_ids; }
std::optional<TokenId> Vocab::find(std::string_view text) const {
  const TokenId id = impl_->lookup(text);
  if (id == kNoToken) return std::nullopt;
  return id;
}
size_t Vocab::merge_count() const { return impl_->bpe.merge_count; }
const SpecialTokens& Vocab::special() const { return impl_->special; }
bool Vocab::add_bos() const { return impl_->add_bos; }
bool Vocab::add_eos() const { return impl_->add_eos; }
bool Vocab::add_sep() const { return impl_->add_sep; }
bool Vocab::add_space_prefix() const { return impl_->add_space_prefix; }
bool Vocab::clean_spaces() const { return impl_->clean_spaces; }

std::vector<TokenId> Vocab::encode(std::string_view text, const EncodeOptions& options) const {
  std::vector<TokenId> out;
  encode(text, options, out);
  return out;
}

void Vocab::encode(std::string_view raw_text, const EncodeOptions& options, std::vector<TokenId>& out) const {
  const Impl& v = *impl_;
  if (raw_text.size() > UINT32_MAX / 4) throw TokenizerError("text too long to tokenize (" + std::to_string(raw_text.size()) + " bytes)");
  std::string sanitized;
  std::string_view text = raw_text;
  if (!utf8::is_valid(raw_text)) {
    utf8::sanitize(raw_text, sanitized);
    text = sanitized;
  }

  std::vector<Fragment> fragments;
  if (!text.empty()) v.partition(text, options.parse_special, fragments);

  if (options.add_special && v.add_bos) out.push_back(v.special.bos);
  if (v.kind == VocabKind::kSpm) {
    bool after_special = true;  // the space prefix goes before the first text and after each special token
    std::string escaped;
    for (const Fragment& f : fragments) {
      if (f.token != kNoToken) {
        out.push_back(f.token);
        after_special = true;
        continue;
      }
      escaped.clear();
      if (v.add_space_prefix && after_special) escaped += kEscapedSpace;
      const std::string_view piece = text.substr(f.begin, f.end - f.begin);
      escaped.reserve(escaped.size() + piece.size() + piece.size() / 2);
      size_t start = 0;
      for (size_t i = 0; i < piece.size(); ++i) {
        if (piece[i] == ' ') {
          escaped.append(piece.data() + start, i - start);
          escaped += kEscapedSpace;
          start = i + 1;
        }
      }
      escaped.append(piece.data() + start, piece.size() - start);
      v.encode_spm(escaped, out);
      after_special = false;
    }
  } else {
    for (const Fragment& f : fragments) {
      if (f.token != kNoToken) {
        out.push_back(f.token);
      } else if (v.kind == VocabKind::kBpe) {
        v.encode_bpe(text.substr(f.begin, f.end - f.begin), out);
      } else {
        v.encode_wpm(text.substr(f.begin, f.end - f.begin), out);
      }
    }
  }
  if (options.add_special && v.add_eos) out.push_back(v.special.eos);
  if (options.add_special && v.add_sep) out.push_back(v.special.sep);
}

}  // namespace m40::tokenizer
