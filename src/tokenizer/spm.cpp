// SentencePiece-style tokenization (tokenizer.ggml.model = "llama"), with the
// result of llama.cpp's llm_tokenizer_spm: the text (spaces already written
// as ▁) starts as one symbol per character; the adjacent pair whose
// concatenation is the highest-scoring token merges first (leftmost on a
// tie), until no pair forms a token; a final symbol that is not a token is
// written as byte tokens <0xXX> (byte fallback).
//
// Speed: the pairs that can merge are precomputed as (symbol id, symbol id)
// -> token, and the text is cut where two neighbouring characters never
// appear side by side in any token: no merge can cross such a cut, so the
// pieces are independent (same result) and repeated pieces are merged once.
#include <string>

#include "tokenizer/merge.h"
#include "tokenizer/utf8.h"
#include "tokenizer/word_cache.h"
#include "tokenizer/vocab_impl.h"

namespace m40::tokenizer {

int32_t SpmModel::symbol_of(char32_t cp) const {
  if (cp < bmp_symbol.size()) return bmp_symbol[cp];
  auto it = astral_symbol.find(cp);
  return it == astral_symbol.end() ? kUnknownChar : it->second;
}

void Vocab::Impl::build_spm() {
  const int32_t n = static_cast<int32_t>(tokens.size());
  spm.bmp_symbol.assign(0x10000, SpmModel::kUnknownChar);
  int32_t next_virtual = n;
  auto set_symbol = [&](char32_t cp, int32_t id) {
    if (cp < 0x10000) {
      spm.bmp_symbol[cp] = id;
    } else {
      spm.astral_symbol[cp] = id;
    }
  };

  // Characters: a single-character token is its own symbol; other characters
  // that occur inside tokens get virtual ids.
  std::vector<std::vector<char32_t>> chars(tokens.size());
  for (int32_t id = 0; id < n; ++id) {
    const std::string& text = tokens[id].text;
    if (!utf8::is_valid(text)) continue;  // can never match sanitized input
    for (size_t i = 0; i < text.size();) chars[id].push_back(utf8::decode(text, i));
    if (chars[id].size() == 1) set_symbol(chars[id][0], id);
  }
  for (int32_t id = 0; id < n; ++id) {
    if (chars[id].size() < 2) continue;
    for (char32_t cp : chars[id]) {
      if (spm.symbol_of(cp) == SpmModel::kUnknownChar) set_symbol(cp, next_virtual++);
    }
  }

  // Every split of every token into two symbols, and the character pairs
  // that occur inside tokens.
  spm.pairs.reserve(tokens.size() * 4);
  spm.adjacent.reserve(tokens.size() * 4);
  std::string scratch;
  for (int32_t id = 0; id < n; ++id) {
    const std::vector<char32_t>& cps = chars[id];
    if (cps.size() < 2) continue;
    const std::string& text = tokens[id].text;
    const SpmModel::Merge merge{tokens[id].score, id};
    size_t split = 0;  // byte offset of the split
    for (size_t k = 1; k < cps.size(); ++k) {
      scratch.clear();
      utf8::append(scratch, cps[k - 1]);
      split += scratch.size();
      spm.adjacent.insert(spm.symbol_of(cps[k - 1]), spm.symbol_of(cps[k]), 1);
      const int32_t left = k == 1 ? spm.symbol_of(cps[0]) : lookup(std::string_view(text).substr(0, split));
      const int32_t right = k + 1 == cps.size() ? spm.symbol_of(cps[k]) : lookup(std::string_view(text).substr(split));
      if (left < 0 || right < 0) continue;
      spm.pairs.insert(left, right, merge);
    }
  }

  spm.byte_token.assign(256, kNoToken);
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const char name[7] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>', 0};
    TokenId id = lookup(name);
    if (id == kNoToken) id = lookup(std::string(1, static_cast<char>(b)));
    spm.byte_token[b] = id;
  }
}

void Vocab::Impl::encode_spm(std::string_view text, std::vector<TokenId>& out) const {
  const int32_t n_vocab = static_cast<int32_t>(tokens.size());

  // One symbol per character.
  std::vector<Symbol> chars;
  chars.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t start = i;
    const char32_t cp = utf8::decode(text, i);
    chars.push_back({spm.symbol_of(cp), static_cast<uint32_t>(start), static_cast<uint32_t>(i - start)});
  }

  auto merge_of = [&](int32_t left, int32_t right, float& score, int32_t& result) {
    const SpmModel::Merge* m = spm.pairs.find(left, right);
    if (m == nullptr) return false;
    score = m->score;
    result = m->result;
    return true;
  };
  auto emit = [&](const Symbol& s) {
    if (s.id >= 0 && s.id < n_vocab) {
      out.push_back(s.id);
      return;
    }
    // Byte fallback. A vocabulary without byte tokens (llama.cpp stops with
    // an exception there) gets one UNK for the character.
    const size_t mark = out.size();
    for (uint32_t k = 0; k < s.len; ++k) {
      const TokenId b = spm.byte_token[static_cast<uint8_t>(text[s.start + k])];
      if (b == kNoToken) {
        out.resize(mark);
        if (special.unk == kNoToken) {
          throw TokenizerError("cannot tokenize '" + std::string(text.substr(s.start, s.len)) +
                               "': the vocabulary has neither byte tokens nor an UNK token");
        }
        out.push_back(special.unk);
        return;
      }
      out.push_back(b);
    }
  };

  // Cut where no merge can cross, merge each piece (once per distinct piece).
  WordCache cache;
  std::vector<Symbol> segment;
  size_t begin = 0;
  while (begin < chars.size()) {
    size_t end = begin + 1;
    while (end < chars.size() && chars[end - 1].id != SpmModel::kUnknownChar && chars[end].id != SpmModel::kUnknownChar &&
           spm.adjacent.find(chars[end - 1].id, chars[end].id) != nullptr) {
      ++end;
    }
    if (end - begin == 1) {
      emit(chars[begin]);
      begin = end;
      continue;
    }
    const uint32_t byte_begin = chars[begin].start;
    const uint32_t byte_end = chars[end - 1].start + chars[end - 1].len;
    const std::string_view piece = text.substr(byte_begin, byte_end - byte_begin);
    if (cache.find(piece, out)) {
      begin = end;
      continue;
    }
    segment.assign(chars.begin() + static_cast<std::ptrdiff_t>(begin), chars.begin() + static_cast<std::ptrdiff_t>(end));
    merge_symbols<float>(segment, merge_of);
    const size_t mark = out.size();
    for (const Symbol& s : segment) emit(s);
    if (piece.size() <= 256) {
      cache.insert(piece, out.data() + mark, out.size() - mark);
    }
    begin = end;
  }
}

}  // namespace m40::tokenizer
