#include "grammar/grammar.h"

#include "grammar/automaton.h"
#include "grammar/gbnf_parser.h"
#include "grammar/grammar_compiler.h"

namespace m40::grammar {

Grammar::Grammar(std::shared_ptr<const detail::Automaton> automaton, std::string source, std::string root)
    : automaton_(std::move(automaton)), source_(std::move(source)), root_(std::move(root)) {}

Grammar::~Grammar() = default;

const std::vector<std::string>& Grammar::rule_names() const { return automaton_->source_rules; }

size_t Grammar::state_count() const { return automaton_->states.size(); }

std::shared_ptr<const Grammar> parse_gbnf(std::string_view text, std::string_view root) {
  const detail::GbnfAst ast = detail::parse_gbnf_text(text);
  auto automaton = detail::compile_grammar(ast, root);
  return std::make_shared<const Grammar>(std::move(automaton), std::string(text), std::string(root));
}

}  // namespace m40::grammar
