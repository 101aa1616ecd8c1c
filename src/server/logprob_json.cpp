#include "server/logprob_json.h"

#include <string>

namespace m40::server {

json token_logprob_json(const tokenizer::Vocab& vocab, int32_t id, float logprob) {
  const std::string& piece = vocab.piece(id);
  json bytes = json::array();
  for (unsigned char c : piece) bytes.push_back(static_cast<int>(c));
  return {{"token", piece}, {"logprob", logprob}, {"bytes", std::move(bytes)}};
}

json logprob_entries(const tokenizer::Vocab& vocab, const std::vector<engine::TokenLogprob>& tokens) {
  json out = json::array();
  for (const auto& t : tokens) {
    json entry = token_logprob_json(vocab, t.token, t.logprob);
    json top = json::array();
    for (const auto& [id, lp] : t.top) top.push_back(token_logprob_json(vocab, id, lp));
    entry["top_logprobs"] = std::move(top);
    out.push_back(std::move(entry));
  }
  return out;
}

}  // namespace m40::server
