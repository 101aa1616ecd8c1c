// The vocabulary of a GGUF model and its tokenizer: text -> token ids and
// token ids -> text, exact to llama.cpp (and through it to the Hugging Face
// tokenizers) for SentencePiece-style (`tokenizer.ggml.model` = "llama") and
// byte-level BPE ("gpt2") vocabularies. See docs/tokenizer.md.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer_error.h"

namespace m40::gguf {
class Metadata;
}

namespace m40::tokenizer {

using TokenId = int32_t;
inline constexpr TokenId kNoToken = -1;

// GGUF's token types (`tokenizer.ggml.token_type`).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};
std::string_view token_type_name(TokenType type);

enum class VocabKind {
  kSpm,  // "llama": SentencePiece BPE by score, byte fallback, ▁ for spaces
  kBpe,  // "gpt2": byte-level BPE by merge rank after a regex pre-tokenizer
  kWpm,  // "bert": WordPiece, greedy longest match per word after BERT's normalization
};

// Special token ids; kNoToken where the vocabulary has none.
struct SpecialTokens {
  TokenId bos = kNoToken;
  TokenId eos = kNoToken;
  TokenId eot = kNoToken;  // end of turn: <|eot_id|>, <|im_end|>, <|end|>, ...
  TokenId eom = kNoToken;
  TokenId unk = kNoToken;
  TokenId sep = kNoToken;
  TokenId pad = kNoToken;
  TokenId mask = kNoToken;
  TokenId newline = kNoToken;  // what "\n" tokenizes to
  // Fill-in-the-middle: prefix, suffix and middle markers of code models
  // (Qwen2.5-Coder <|fim_prefix|>, StarCoder <fim_prefix>, CodeLlama <PRE>,
  // DeepSeek-Coder <｜fim▁begin｜>, ...).
  TokenId fim_pre = kNoToken;
  TokenId fim_suf = kNoToken;
  TokenId fim_mid = kNoToken;
  bool has_fim() const { return fim_pre != kNoToken && fim_suf != kNoToken && fim_mid != kNoToken; }
};

struct EncodeOptions {
  // Add BOS / EOS as the vocabulary asks (tokenizer.ggml.add_bos_token,
  // add_eos_token, or llama.cpp's defaults for the model family); WordPiece:
  // [CLS] before and [SEP] after.
  bool add_special = true;
  // Text such as "<|im_start|>" or "<s>" becomes that one control token.
  // Off: it is tokenized as ordinary text. (User-defined tokens are always
  // matched whole, as the Hugging Face tokenizers do.)
  bool parse_special = false;
};

struct DecodeOptions {
  // Drop a leading BOS and a trailing EOS (when the vocabulary adds them).
  bool remove_special = false;
  // Write control tokens as their text ("<|im_end|>"); otherwise they vanish.
  bool render_special = false;
};

class Vocab {
 public:
  // Builds the vocabulary from a model's `tokenizer.*` metadata. Throws
  // TokenizerError for a missing or malformed key, an unknown
  // `tokenizer.ggml.pre`, or a tokenizer model that is not supported yet
  // (WordPiece "bert", Unigram "t5", "rwkv", ...).
  static Vocab from_metadata(const gguf::Metadata& metadata);
  // Opens a GGUF file (only its metadata is read).
  static Vocab from_file(const std::string& path);

  Vocab(Vocab&&) noexcept;
  Vocab& operator=(Vocab&&) noexcept;
  ~Vocab();

  VocabKind kind() const;
  const std::string& model_name() const;  // tokenizer.ggml.model
  // The pre-tokenizer flavour's name ("default" for SPM).
  const std::string& pre_name() const;
  // Notes about fallbacks taken while loading (e.g. no tokenizer.ggml.pre).
  const std::vector<std::string>& warnings() const;

  size_t size() const;
  const std::string& text(TokenId id) const;  // as stored in the vocabulary
  float score(TokenId id) const;
  TokenType type(TokenId id) const;
  bool is_control(TokenId id) const;      // control or unknown type: not text
  bool is_end_of_generation(TokenId id) const;
  // Every end-of-generation token (EOS, EOT, EOM and the known end names), ascending.
  const std::vector<TokenId>& end_of_generation_tokens() const;
  std::optional<TokenId> find(std::string_view text) const;
  size_t merge_count() const;

  const SpecialTokens& special() const;
  bool add_bos() const;
  bool add_eos() const;
  bool add_sep() const;  // WordPiece: [SEP] at the end
  bool add_space_prefix() const;
  bool clean_spaces() const;

  // Tokenizes UTF-8 text. Invalid UTF-8 is not an error: each byte that does
  // not start a well-formed character is read as U+FFFD. Thread-safe.
  std::vector<TokenId> encode(std::string_view text, const EncodeOptions& options = {}) const;
  void encode(std::string_view text, const EncodeOptions& options, std::vector<TokenId>& out) const;  // appends

  // The bytes one token stands for: possibly a fragment of a UTF-8
  // character (byte tokens, byte-level BPE). Control and unknown tokens give
  // "" unless render_special. Throws TokenizerError for an out-of-range id.
  const std::string& piece(TokenId id, bool render_special = false) const;

  // Token ids -> text as llama.cpp's llama_detokenize: pieces joined, the
  // first piece's leading space removed for add_space_prefix vocabularies
  // (unless a removed BOS starts the sequence), and for clean_spaces
  // vocabularies " ?", " !", " .", " ,", " 's" ... tidied like the HF
  // decoders. The result may contain broken UTF-8 where the ids cut a
  // character; use StreamingDetokenizer for incremental, always-valid text.
  // Throws TokenizerError for an out-of-range id.
  std::string decode(std::span<const TokenId> ids, const DecodeOptions& options = {}) const;

  // Throws TokenizerError unless 0 <= id < size().
  void check_id(TokenId id) const;

  struct Impl;

 private:
  explicit Vocab(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Turns a stream of token ids into text as they come, never emitting a
// broken UTF-8 sequence: bytes of a character that spans tokens are held
// back until it is complete; bytes that can never form a character become
// U+FFFD. Not thread-safe (one per stream); the Vocab must outlive it.
class StreamingDetokenizer {
 public:
  struct Options {
    // Write control tokens as their text; otherwise they produce nothing.
    bool render_special = false;
    // The ids start a sequence (a prompt with or without BOS): for
    // add_space_prefix vocabularies the space that tokenization put before
    // the first word is dropped, as SentencePiece decoders do. Set false
    // for a continuation, such as the generated tokens after a prompt.
    bool sequence_start = true;
  };

  explicit StreamingDetokenizer(const Vocab& vocab);
  StreamingDetokenizer(const Vocab& vocab, Options options);

  // Appends the text that is now complete to out; returns how many bytes.
  // Throws TokenizerError for an out-of-range id (the state is unchanged).
  size_t push(TokenId id, std::string& out);
  std::string push(TokenId id);
  // End of stream: held-back bytes of an unfinished character become U+FFFD.
  size_t flush(std::string& out);
  std::string flush();
  // Starts a new stream with the same options.
  void reset();
  // Bytes held back, waiting for the rest of a character.
  size_t pending_bytes() const { return pending_.size(); }

 private:
  void emit_complete(std::string& out, size_t& written);

  const Vocab* vocab_;
  Options options_;
  bool first_text_seen_ = false;
  std::string pending_;
};

}  // namespace m40::tokenizer
