// The pre-tokenizer of byte-level BPE vocabularies: the text is cut into
// "words" by a list of regular expressions before BPE merges run inside each
// word. Which list depends on the model family (`tokenizer.ggml.pre`); the
// lists are data in one table (pre_tokenizer.cpp), matched with PCRE2 in UTF
// and Unicode-property mode with JIT.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace m40::tokenizer {

// A byte range [begin, end) of a string.
struct Span {
  uint32_t begin = 0;
  uint32_t end = 0;
  uint32_t size() const { return end - begin; }
  bool operator==(const Span&) const = default;
};

struct PreTokenizerFlavour {
  // llama.cpp's name for the pre-tokenizer type.
  std::string_view name;
  // The `tokenizer.ggml.pre` values that select this flavour.
  std::vector<std::string_view> gguf_names;
  // Applied in order: each one splits the pieces the previous ones left, and
  // both its matches and the text between them become pieces (llama.cpp's
  // unicode_regex_split). Written in PCRE2 syntax; `\s` means Unicode
  // White_Space (see pre_tokenizer.cpp).
  std::vector<std::string_view> regexes;
  // A word that is itself a token becomes that token without merges (llama3).
  bool ignore_merges = false;
  // decode() cleans " ." / " 's" style spaces, as the HF decoder does.
  bool clean_spaces = true;
  // Default for add_bos_token when the file does not set it.
  std::optional<bool> add_bos;
  // The family has no default BOS id (chatglm).
  bool no_default_bos = false;
};

// Every known flavour, "default" first.
const std::vector<PreTokenizerFlavour>& pre_tokenizer_flavours();
// The flavour a `tokenizer.ggml.pre` value selects, or nullptr.
const PreTokenizerFlavour* find_pre_tokenizer_flavour(std::string_view gguf_name);
// "a, b, c": every accepted `tokenizer.ggml.pre` value, for error messages.
std::string known_pre_tokenizer_names();

// Converts one of the table's patterns into what is handed to PCRE2:
// `\s` / `\S` become explicit White_Space classes. Throws TokenizerError on
// constructs it does not translate (`\S` inside a class).
std::string to_pcre2_pattern(std::string_view pattern);

class PreTokenizer {
 public:
  // Compiles the flavour's regexes (with JIT). Throws TokenizerError if one
  // does not compile.
  explicit PreTokenizer(const PreTokenizerFlavour& flavour);
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  const PreTokenizerFlavour& flavour() const { return *flavour_; }

  // Splits valid UTF-8 text into words: byte ranges that cover the text in
  // order, none empty. Thread-safe. Throws TokenizerError if PCRE2 gives up
  // (a match limit), never returns a silently wrong split.
  void split(std::string_view text, std::vector<Span>& words) const;

 private:
  struct Compiled;
  const PreTokenizerFlavour* flavour_;
  std::vector<std::unique_ptr<Compiled>> regexes_;
};

}  // namespace m40::tokenizer
