// Byte-level BPE (tokenizer.ggml.model = "gpt2"), with the result of
// llama.cpp's llm_tokenizer_bpe: the pre-tokenizer cuts the text into words;
// each word's bytes become GPT-2 alphabet characters, one symbol per byte;
// the adjacent pair with the lowest merge rank merges first (leftmost on a
// tie) until no listed merge applies; each final symbol is its token.
//
// Symbols are ids, not strings: a merge is one hash lookup on
// (left id, right id), and a word's bytes map straight to the ids of their
// GPT-2 characters, so the byte-to-unicode text is never built.
#include <string>

#include "tokenizer/merge.h"
#include "tokenizer/utf8.h"
#include "tokenizer/word_cache.h"
#include "tokenizer/vocab_impl.h"

namespace m40::tokenizer {

void Vocab::Impl::build_bpe(const std::vector<std::string>& merge_list) {
  const int32_t n = static_cast<int32_t>(tokens.size());
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> virtual_ids;
  // The symbol id of a string: its token, else a virtual id of its own.
  auto symbol_of = [&](std::string_view text) -> int32_t {
    if (TokenId id = lookup(text); id != kNoToken) return id;
    auto it = virtual_ids.find(text);
    if (it != virtual_ids.end()) return it->second;
    const int32_t id = n + static_cast<int32_t>(bpe.virtual_texts.size());
    bpe.virtual_texts.emplace_back(text);
    virtual_ids.emplace(std::string(text), id);
    return id;
  };

  const auto& byte_map = utf8::byte_to_codepoint();
  bpe.byte_symbol.assign(256, 0);
  std::string ch;
  for (int b = 0; b < 256; ++b) {
    ch.clear();
    utf8::append(ch, byte_map[b]);
    bpe.byte_symbol[b] = symbol_of(ch);
  }

  bpe.merges.reserve(merge_list.size());
  bpe.merge_count = merge_list.size();
  std::string joined;
  for (size_t rank = 0; rank < merge_list.size(); ++rank) {
    const std::string& m = merge_list[rank];
    const size_t space = m.find(' ', 1);
    if (space == std::string::npos) continue;  // malformed: never matches (as in llama.cpp)
    const std::string_view left(m.data(), space);
    const std::string_view right(m.data() + space + 1, m.size() - space - 1);
    joined.assign(left);
    joined.append(right);
    const int32_t l = symbol_of(left);
    const int32_t r = symbol_of(right);
    bpe.merges.insert(l, r, {static_cast<int32_t>(rank), symbol_of(joined)});
  }

  if (ignore_merges) {
    // Tokens written in the GPT-2 alphabet, by the raw bytes they stand for.
    for (int32_t id = 0; id < n; ++id) {
      const std::string& text = tokens[id].text;
      if (!utf8::is_valid(text)) continue;
      std::string raw;
      bool byte_level = true;
      for (size_t i = 0; i < text.size() && byte_level;) {
        const int b = utf8::codepoint_to_byte(utf8::decode(text, i));
        if (b < 0) {
          byte_level = false;
        } else {
          raw += static_cast<char>(b);
        }
      }
      if (byte_level) bpe.whole_words.emplace(std::move(raw), id);
    }
  }
}

void Vocab::Impl::encode_bpe(std::string_view text, std::vector<TokenId>& out) const {
  const int32_t n_vocab = static_cast<int32_t>(tokens.size());
  std::vector<Span> words;
  pre_tokenizer->split(text, words);

  auto merge_of = [&](int32_t left, int32_t right, int32_t& priority, int32_t& result) {
    const BpeModel::Merge* m = bpe.merges.find(left, right);
    if (m == nullptr) return false;
    priority = -m->rank;
    result = m->result;
    return true;
  };
  auto emit = [&](int32_t id) {
    if (id < n_vocab) {
      out.push_back(id);
      return;
    }
    // Not a token: llama.cpp then looks each byte of its text up as a
    // one-byte token (which usually exists only for ASCII).
    for (char c : bpe.virtual_texts[id - n_vocab]) {
      if (TokenId t = lookup(std::string_view(&c, 1)); t != kNoToken) out.push_back(t);
    }
  };

  WordCache cache;
  std::vector<Symbol> symbols;
  for (const Span w : words) {
    const std::string_view word = text.substr(w.begin, w.size());
    if (ignore_merges) {
      if (auto it = bpe.whole_words.find(word); it != bpe.whole_words.end()) {
        out.push_back(it->second);
        continue;
      }
    }
    if (word.size() == 1) {
      emit(bpe.byte_symbol[static_cast<uint8_t>(word[0])]);
      continue;
    }
    if (cache.find(word, out)) {
      continue;
    }
    symbols.resize(word.size());
    for (size_t i = 0; i < word.size(); ++i) {
      symbols[i] = {bpe.byte_symbol[static_cast<uint8_t>(word[i])], static_cast<uint32_t>(i), 1};
    }
    merge_symbols<int32_t>(symbols, merge_of);
    const size_t mark = out.size();
    for (const Symbol& s : symbols) emit(s.id);
    if (word.size() <= 256) {
      cache.insert(word, out.data() + mark, out.size() - mark);
    }
  }
}

}  // namespace m40::tokenizer
