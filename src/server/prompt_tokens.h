// A prompt's tokens, bounded before it is tokenized. Tokenizing costs about
// 75 bytes of memory per byte of text (an 8 MiB prompt took 630 MB and 2 s
// on the CPU of the CI machine, eight at once 5 GB), so a text too long for
// the context is never tokenized whole: no token stands for more than
// max_token_bytes() bytes of text, so a text of n_ctx * that many bytes
// has at least n_ctx tokens and cannot fit (`tokens >= n_ctx` is refused).
// Such a prompt is refused with 400 at once; with "truncate": true only its
// end, the part whose tokens can be kept, is tokenized (plus its BOS), and
// truncate_prompt() then cuts it as it cuts any long prompt.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace m40::server {

// The most bytes of text one token of `vocab` can stand for (its longest
// text or piece, special tokens included, and at least 4, one UTF-8
// character as an unknown token); 0 when there is no such bound (WordPiece
// drops whitespace, so its text may yield no token at all).
size_t max_token_bytes(const tokenizer::Vocab& vocab);

// 0 when `bytes` of text may fit a context of `n_ctx` tokens; else the
// fewest tokens they can have (at least n_ctx).
size_t least_tokens_past_context(size_t max_token_bytes, int n_ctx, size_t bytes);

// The tokens of `text` for a context of `n_ctx` positions (special tokens
// parsed; BOS/EOS as the vocabulary asks when `add_special`). Throws
// HttpError 400 when the text cannot fit, unless `truncate`: then the
// tokens may leave out the text's beginning (all but its BOS), which
// truncation would drop anyway.
std::vector<int32_t> prompt_tokens(const tokenizer::Vocab& vocab, size_t max_token_bytes, int n_ctx,
                                   std::string_view text, bool add_special, bool truncate);

}  // namespace m40::server
