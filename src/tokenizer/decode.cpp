// Token ids -> text: each token's piece (llama.cpp's token_to_piece), the
// batch decode (llama_detokenize) and the streaming detokenizer.
#include <cstring>

#include "tokenizer/utf8.h"
#include "tokenizer/vocab_impl.h"

namespace m40::tokenizer {

namespace {

constexpr uint16_t kAttrSpecialText = kAttrControl | kAttrUnknown;
const std::string kEmpty;

// "<0x0A>" -> 0x0A, or -1.
int parse_byte_token(const std::string& text) {
  if (text.size() != 6 || text.compare(0, 3, "<0x") != 0 || text[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(text[3]);
  const int lo = hex(text[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t start = 0;
  for (size_t pos; (pos = s.find(from, start)) != std::string::npos; start = pos + from.size()) {
    out.append(s, start, pos - start);
    out += to;
  }
  out.append(s, start, std::string::npos);
  s.swap(out);
}

}  // namespace

void Vocab::Impl::build_pieces() {
  pieces.assign(tokens.size(), std::string());
  for (size_t id = 0; id < tokens.size(); ++id) {
    const TokenData& t = tokens[id];
    std::string& piece = pieces[id];
    if (t.attr & (kAttrSpecialText | kAttrUserDefined)) {
      piece = t.text;
    } else if (t.attr & kAttrNormal) {
      if (kind != VocabKind::kBpe) {  // SPM and WordPiece write spaces as ▁
        piece = t.text;
        replace_all(piece, "\xE2\x96\x81", " ");
      } else {
        // Back from the GPT-2 alphabet to bytes. A character outside it
        // (llama.cpp writes "[UNK_BYTE_0x...]") is kept as it is.
        for (size_t i = 0; i < t.text.size();) {
          const size_t start = i;
          const size_t len = utf8::valid_length(t.text, i);
          if (len == 0) {
            piece += t.text[i++];
            continue;
          }
          const int b = utf8::codepoint_to_byte(utf8::decode(t.text, i));
          if (b >= 0) {
            piece += static_cast<char>(b);
          } else {
            piece.append(t.text, start, i - start);
          }
        }
      }
    } else if (t.attr & kAttrByte) {
      const int b = parse_byte_token(t.text);
      piece = b >= 0 ? std::string(1, static_cast<char>(b)) : t.text;
    }
    // Unused and undefined tokens decode to nothing (as in llama.cpp).
  }
}

const std::string& Vocab::piece(TokenId id, bool render_special) const {
  check_id(id);
  if (!render_special && (impl_->tokens[id].attr & kAttrSpecialText)) return kEmpty;
  return impl_->pieces[id];
}

std::string Vocab::decode(std::span<const TokenId> ids, const DecodeOptions& options) const {
  const Impl& v = *impl_;
  for (TokenId id : ids) check_id(id);
  bool remove_space = v.add_space_prefix;
  if (options.remove_special && v.add_bos && !ids.empty() && ids.front() == v.special.bos) {
    // llama.cpp keeps the leading space after a BOS it removes.
    remove_space = false;
    ids = ids.subspan(1);
  }
  if (options.remove_special && v.add_eos && !ids.empty() && ids.back() == v.special.eos) {
    ids = ids.subspan(0, ids.size() - 1);
  }
  std::string text;
  for (TokenId id : ids) {
    std::string_view p = piece(id, options.render_special);
    if (remove_space && !p.empty() && p.front() == ' ') p.remove_prefix(1);
    remove_space = false;
    text += p;
  }
  if (!v.clean_spaces || text.empty()) return text;

  // Tidy the spaces BPE decoders leave around punctuation: llama.cpp's three
  // in-place passes (after the Hugging Face clean_up_tokenization), kept
  // in-place because each pass reads what the pass itself rewrote.
  size_t total = text.size();
  {
    const size_t n = total;
    total = 1;
    for (size_t i = 1; i < n; ++i) {
      const char x = text[i];
      if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) --total;  // " ?" -> "?"
      text[total++] = x;
    }
  }
  {
    const size_t n = total;
    total = 1;
    for (size_t i = 1; i < n; ++i) {
      const char x = text[i];
      if (x == '\'' && i + 1 < n && text[i - 1] == ' ' && text[i + 1] == ' ') {  // " ' " -> "'"
        --total;
        text[++i] = '\0';
      }
      text[total++] = x;
    }
  }
  {
    const size_t n = total;
    total = 1;
    for (size_t i = 1; i < n; ++i) {
      const char x = text[i];
      if (text[i - 1] == ' ' && x == '\'' && i + 1 < n) {
        const char x1 = text[i + 1];
        if (x1 == 's' || x1 == 'm') {
          --total;  // " 's", " 'm"
        } else if (i + 2 < n && ((x1 == 'r' && text[i + 2] == 'e') || (x1 == 'v' && text[i + 2] == 'e'))) {
          --total;  // " 're", " 've"
        }
      }
      text[total++] = x;
    }
  }
  text.resize(total);
  return text;
}

StreamingDetokenizer::StreamingDetokenizer(const Vocab& vocab) : StreamingDetokenizer(vocab, Options{}) {}
StreamingDetokenizer::StreamingDetokenizer(const Vocab& vocab, Options options) : vocab_(&vocab), options_(options) {}

void StreamingDetokenizer::reset() {
  first_text_seen_ = false;
  pending_.clear();
}

size_t StreamingDetokenizer::push(TokenId id, std::string& out) {
  std::string_view p = vocab_->piece(id, options_.render_special);  // throws for a bad id
  if (!vocab_->is_control(id)) {
    if (!first_text_seen_ && options_.sequence_start && vocab_->add_space_prefix() && !p.empty() && p.front() == ' ') {
      p.remove_prefix(1);
    }
    first_text_seen_ = true;
  }
  pending_ += p;
  size_t written = 0;
  emit_complete(out, written);
  return written;
}

std::string StreamingDetokenizer::push(TokenId id) {
  std::string out;
  push(id, out);
  return out;
}

void StreamingDetokenizer::emit_complete(std::string& out, size_t& written) {
  const std::string_view s = pending_;
  const size_t before = out.size();
  size_t i = 0;
  size_t run_start = 0;  // start of well-formed bytes not yet copied
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t len = utf8::valid_length(s, i);
    if (len > 0) {
      i += len;
      continue;
    }
    // Not a whole character here: wait for more bytes if they could still
    // complete it, else it can never be one.
    if (utf8::incomplete_tail(s.substr(i)) == s.size() - i) break;
    out.append(s.data() + run_start, i - run_start);
    out += utf8::kReplacement;
    ++i;
    run_start = i;
  }
  out.append(s.data() + run_start, i - run_start);
  pending_.erase(0, i);
  written += out.size() - before;
}

size_t StreamingDetokenizer::flush(std::string& out) {
  size_t written = 0;
  if (!pending_.empty()) {
    out += utf8::kReplacement;  // an unfinished character at the end
    written = utf8::kReplacement.size();
    pending_.clear();
  }
  first_text_seen_ = false;
  return written;
}

std::string StreamingDetokenizer::flush() {
  std::string out;
  flush(out);
  return out;
}

}  // namespace m40::tokenizer
