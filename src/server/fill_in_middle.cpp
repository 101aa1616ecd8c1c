#include "server/fill_in_middle.h"

#include <string>

#include "server/http_error.h"
#include "server/prompt_tokens.h"

namespace m40::server {

std::vector<int32_t> infill_prompt(const ResidentModel& m, std::string_view prefix, std::string_view suffix,
                                   std::string_view middle, int n_ctx) {
  const tokenizer::Vocab& vocab = *m.vocab;
  const tokenizer::SpecialTokens& special = vocab.special();
  if (!special.has_fim()) {
    throw HttpError{400, "the model '" + m.name +
                             "' does not support fill-in-the-middle ('suffix'): its vocabulary has no FIM prefix, "
                             "suffix and middle tokens"};
  }
  const size_t bytes = prefix.size() + suffix.size() + middle.size();
  if (const size_t least = least_tokens_past_context(m.max_token_bytes, n_ctx, bytes); least > 0) {
    throw HttpError{400, "the prompt and suffix have " + std::to_string(bytes) + " bytes, at least " +
                             std::to_string(least) + " tokens, but the context holds " + std::to_string(n_ctx)};
  }
  const tokenizer::EncodeOptions plain{.add_special = false, .parse_special = false};
  std::vector<int32_t> tokens;
  if (vocab.add_bos() && special.bos != tokenizer::kNoToken) tokens.push_back(special.bos);
  tokens.push_back(special.fim_pre);
  vocab.encode(prefix, plain, tokens);
  tokens.push_back(special.fim_suf);
  vocab.encode(suffix, plain, tokens);
  tokens.push_back(special.fim_mid);
  vocab.encode(middle, plain, tokens);
  return tokens;
}

}  // namespace m40::server
