#include "engine/answer_grammar.h"

#include <string>
#include <vector>

#include "grammar/grammar.h"

namespace m40::engine {

std::shared_ptr<const grammar::TokenVocabulary> grammar_vocabulary(const tokenizer::Vocab& vocab) {
  std::vector<std::string> pieces(vocab.size());
  for (size_t id = 0; id < vocab.size(); ++id) {
    const auto t = static_cast<tokenizer::TokenId>(id);
    if (!vocab.is_control(t)) pieces[id] = vocab.piece(t, true);
  }
  return std::make_shared<grammar::TokenVocabulary>(std::move(pieces), vocab.end_of_generation_tokens());
}

AnswerGrammar answer_grammar(std::string_view gbnf, std::shared_ptr<const grammar::TokenVocabulary> vocabulary) {
  AnswerGrammar g;
  g.grammar = grammar::parse_gbnf(gbnf);
  g.vocabulary = std::move(vocabulary);
  return g;
}

}  // namespace m40::engine
