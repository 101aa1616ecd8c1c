// WordPiece (tokenizer.ggml.model = "bert"), with the result of llama.cpp's
// llm_tokenizer_wpm: the text is normalized (accents stripped through the
// first character of each NFD decomposition, lowercased) and cut at
// whitespace, around punctuation, ASCII symbols and CJK ideographs; each word,
// with ▁ before it, is then covered greedily from the left by the longest
// tokens; a word that cannot be covered is one UNK.
#include <algorithm>
#include <string>

#include "common/unicode.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab_impl.h"

namespace m40::tokenizer {

namespace {

// The CJK ideograph blocks of BERT's BasicTokenizer (llama.cpp keeps the HF
// code's 0x2B920 where the block starts at 0x2B820).
bool is_chinese_char(char32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
         (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

constexpr std::string_view kWordStart = "\xE2\x96\x81";  // ▁

}  // namespace

void Vocab::Impl::encode_wpm(std::string_view text, std::vector<TokenId>& out) const {
  using namespace m40::unicode;
  std::vector<std::string> words(1);
  for (size_t i = 0; i < text.size();) {
    char32_t cp = utf8::decode(text, i);
    if (wpm_strip_accents) cp = nfd_first(cp);
    const uint8_t f = flags(cp);
    if (f & kWhiteSpace) {
      if (!words.back().empty()) words.emplace_back();
      continue;
    }
    if (cp == 0 || cp == 0xFFFD || (f & kControl)) continue;
    if (wpm_strip_accents && (f & kMark)) continue;
    std::string s;
    utf8::append(s, wpm_lowercase ? to_lower(cp) : cp);
    if ((f & kPunctuation) || (cp < 0x7F && (f & kSymbol)) || is_chinese_char(cp)) {
      if (!words.back().empty()) words.emplace_back();
      words.back() = std::move(s);
      words.emplace_back();
    } else {
      words.back() += s;
    }
  }

  std::string word;
  for (const std::string& w : words) {
    if (w.empty()) continue;
    word.assign(kWordStart);
    word += w;
    const size_t n = word.size();
    const size_t mark = out.size();
    for (size_t i = 0; i < n;) {
      size_t matched = 0;
      for (size_t j = std::min(n, i + max_token_len + 1); j > i; --j) {
        if (TokenId id = lookup(std::string_view(word).substr(i, j - i)); id != kNoToken) {
          out.push_back(id);
          matched = j;
          break;
        }
      }
      if (matched == 0) {
        out.resize(mark);  // the word cannot be covered: all of it is unknown
        break;
      }
      i = matched;
    }
    if (out.size() == mark) out.push_back(special.unk);
  }
}

}  // namespace m40::tokenizer
