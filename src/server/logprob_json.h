// Log-probabilities as OpenAI's chat completions and Ollama show them: per
// token {token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}.
#pragma once

#include <vector>

#include "engine/token_loop.h"
#include "server/server_context.h"
#include "tokenizer/vocab.h"

namespace m40::server {

// A token's text (a piece may hold part of a UTF-8 character; the JSON
// writer replaces what is not valid), its log-probability and its exact bytes.
json token_logprob_json(const tokenizer::Vocab& vocab, int32_t id, float logprob);
// One entry per token, with its alternatives.
json logprob_entries(const tokenizer::Vocab& vocab, const std::vector<engine::TokenLogprob>& tokens);

}  // namespace m40::server
