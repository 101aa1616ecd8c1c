// Internal: the state behind tokenizer::Vocab and the pieces of the encoder,
// shared by vocab.cpp (loading), special_tokens.cpp, spm.cpp, bpe.cpp and
// decode.cpp. Not part of the public API.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/pair_map.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/vocab.h"

namespace m40::tokenizer {

// Token attributes, as llama.cpp derives them from the GGUF token types (a
// token can gain CONTROL when its text names an end-of-generation token).
enum TokenAttr : uint16_t {
  kAttrUndefined = 1 << 0,
  kAttrUnknown = 1 << 1,
  kAttrUnused = 1 << 2,
  kAttrNormal = 1 << 3,
  kAttrControl = 1 << 4,
  kAttrUserDefined = 1 << 5,
  kAttrByte = 1 << 6,
  kAttrLstrip = 1 << 7,  // a matched special token swallows the spaces before it
  kAttrRstrip = 1 << 8,  // ... and after it
};

struct TokenData {
  std::string text;
  float score = 0.0f;
  TokenType type = TokenType::kNormal;
  uint16_t attr = kAttrNormal;
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

// A byte trie over the special tokens' texts: from a position in the text,
// every special token that starts there, in one walk.
struct SpecialTrie {
  struct Node {
    int32_t rank = -1;          // index into Impl::special_tokens of the token ending here
    uint32_t first_child = 0;   // into children
    uint32_t child_count = 0;
  };
  struct Child {
    uint8_t byte;
    uint32_t node;
  };
  std::vector<Node> nodes;      // nodes[0] is the root
  std::vector<Child> children;  // each node's children, sorted by byte
  std::vector<uint32_t> root;   // byte -> child of the root (0: none)

  void build(const std::vector<std::string_view>& texts);
  // Calls found(rank) for each text that starts at text[p], shortest first.
  template <class F>
  void match(std::string_view text, size_t p, F&& found) const {
    if (root.empty()) return;
    uint32_t node = root[static_cast<uint8_t>(text[p])];
    while (node != 0) {
      if (nodes[node].rank >= 0) found(static_cast<uint32_t>(nodes[node].rank));
      if (++p >= text.size()) return;
      const uint8_t b = static_cast<uint8_t>(text[p]);
      const Node& n = nodes[node];
      uint32_t lo = n.first_child, hi = n.first_child + n.child_count;
      node = 0;
      while (lo < hi) {
        const uint32_t mid = (lo + hi) / 2;
        if (children[mid].byte < b) {
          lo = mid + 1;
        } else {
          hi = mid;
        }
      }
      if (lo < n.first_child + n.child_count && children[lo].byte == b) node = children[lo].node;
    }
  }
};

// One piece of the text after special tokens are cut out: either text to
// tokenize or a token found whole.
struct Fragment {
  uint32_t begin = 0;
  uint32_t end = 0;
  TokenId token = kNoToken;  // kNoToken: text [begin, end)
};

// SentencePiece-style merging. Every symbol the merge loop can hold is one
// character of the input or a vocabulary token, so each gets an id: a token's
// id, or for a character that is not a token a "virtual" id >= the
// vocabulary size. Every split of every token into two such symbols is in
// `pairs`, so a merge is one hash lookup on two ids.
struct SpmModel {
  static constexpr int32_t kUnknownChar = -2;  // a character no token contains
  struct Merge {
    float score;
    TokenId result;
  };
  std::vector<int32_t> bmp_symbol;                  // code point < 0x10000 -> symbol id
  std::unordered_map<char32_t, int32_t> astral_symbol;
  PairMap<Merge> pairs;                             // (left, right) -> merged token
  PairMap<uint8_t> adjacent;                        // character pairs that occur inside some token
  std::vector<TokenId> byte_token;                  // byte -> <0xXX> token (or the byte itself), kNoToken
  int32_t symbol_of(char32_t cp) const;
};

// Byte-level BPE. Symbols are token ids (or virtual ids >= the vocabulary
// size for the few strings a merge names that are not tokens).
struct BpeModel {
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  std::vector<int32_t> byte_symbol;                 // byte -> symbol of its GPT-2 character
  PairMap<Merge> merges;                            // (left, right) -> (rank, merged symbol)
  std::vector<std::string> virtual_texts;           // text of virtual symbol n_vocab + i
  // For ignore_merges: raw bytes of a word -> the token whose text encodes them.
  std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>> whole_words;
  size_t merge_count = 0;
};

struct Vocab::Impl {
  VocabKind kind = VocabKind::kSpm;
  std::string model_name;
  std::string pre_name;
  std::vector<std::string> warnings;

  std::vector<TokenData> tokens;
  std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>> token_to_id;

  SpecialTokens special;
  std::vector<bool> end_of_generation;
  std::vector<TokenId> end_of_generation_ids;  // the same, as a list
  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = false;
  bool clean_spaces = false;
  bool ignore_merges = false;
  bool add_sep = false;            // WordPiece: [SEP] at the end
  bool wpm_lowercase = true;       // tokenizer.ggml.normalizer.lowercase
  bool wpm_strip_accents = true;   // tokenizer.ggml.normalizer.strip_accents
  size_t max_token_len = 0;        // bytes

  // Tokens matched whole in the text (control, user-defined, unknown), longest
  // first, and a trie of their texts.
  std::vector<TokenId> special_tokens;
  SpecialTrie special_trie;
  bool any_user_defined = false;

  std::vector<std::string> pieces;  // what each token decodes to, control tokens rendered

  std::unique_ptr<PreTokenizer> pre_tokenizer;
  SpmModel spm;
  BpeModel bpe;

  TokenId lookup(std::string_view text) const {
    auto it = token_to_id.find(text);
    return it == token_to_id.end() ? kNoToken : it->second;
  }

  // special_tokens.cpp
  void build_special_index();
  void partition(std::string_view text, bool parse_special, std::vector<Fragment>& out) const;
  // spm.cpp
  void build_spm();
  void encode_spm(std::string_view escaped, std::vector<TokenId>& out) const;
  // bpe.cpp
  void build_bpe(const std::vector<std::string>& merges);
  void encode_bpe(std::string_view text, std::vector<TokenId>& out) const;
  // wpm.cpp
  void encode_wpm(std::string_view text, std::vector<TokenId>& out) const;
  // decode.cpp
  void build_pieces();
};

// For tests: words (BPE) or segments (SPM) of at most this many symbols are
// merged by rescanning a small array; longer ones by a priority queue. Both
// give the same result; the test suite checks that by setting this to 0.
size_t& linear_merge_limit();

}  // namespace m40::tokenizer
