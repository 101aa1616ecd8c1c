#include "server/prompt_tokens.h"

#include <algorithm>
#include <string>

#include "server/http_error.h"

namespace m40::server {

namespace {

// Tokens before the kept ones that a cut through the text may have
// tokenized differently from the whole text; truncation drops them.
constexpr size_t kMarginTokens = 64;

}  // namespace

size_t max_token_bytes(const tokenizer::Vocab& vocab) {
  if (vocab.model_name() != "llama" && vocab.model_name() != "gpt2") return 0;
  size_t longest = 4;
  for (size_t id = 0; id < vocab.size(); ++id) {
    const auto t = static_cast<tokenizer::TokenId>(id);
    longest = std::max({longest, vocab.text(t).size(), vocab.piece(t, true).size()});
  }
  return longest;
}

size_t least_tokens_past_context(size_t max_token_bytes, int n_ctx, size_t bytes) {
  const size_t too_long = static_cast<size_t>(std::max(n_ctx, 1)) * max_token_bytes;
  if (max_token_bytes == 0 || bytes < too_long) return 0;
  return bytes / max_token_bytes;
}

std::vector<int32_t> prompt_tokens(const tokenizer::Vocab& vocab, size_t max_token_bytes, int n_ctx,
                                   std::string_view text, bool add_special, bool truncate) {
  const tokenizer::EncodeOptions options{.add_special = add_special, .parse_special = true};
  const size_t least_tokens = least_tokens_past_context(max_token_bytes, n_ctx, text.size());
  if (least_tokens == 0) return vocab.encode(text, options);
  if (!truncate) {
    throw HttpError{400, "the prompt has " + std::to_string(text.size()) + " bytes, at least " +
                             std::to_string(least_tokens) + " tokens, but the context holds " +
                             std::to_string(n_ctx) +
                             ": shorten the prompt, send \"truncate\": true to keep its end, or start the server "
                             "with a larger --ctx"};
  }
  // The end that holds more tokens than the context: the first kMarginTokens
  // of them absorb what the cut changed.
  size_t start = text.size() - std::min(text.size(), (static_cast<size_t>(n_ctx) + kMarginTokens) * max_token_bytes);
  while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) ++start;  // a whole character
  std::vector<int32_t> tail = vocab.encode(text.substr(start), options);
  const auto bos = vocab.special().bos;
  if (bos != tokenizer::kNoToken && !tail.empty() && tail.front() == bos && add_special) tail.erase(tail.begin());
  // The BOS the whole text starts with: the vocabulary's, or a literal one
  // a chat template wrote.
  std::vector<int32_t> out;
  const std::vector<int32_t> head = vocab.encode(text.substr(0, max_token_bytes), options);
  if (bos != tokenizer::kNoToken && !head.empty() && head.front() == bos) out.push_back(bos);
  out.insert(out.end(), tail.begin(), tail.end());
  return out;
}

}  // namespace m40::server
