// Building the grammar an answer is decoded under (token_loop.h's
// AnswerGrammar) for a model's vocabulary: the server's structured output
// and forced tool calls, and `m40-llm run --format`.
#pragma once

#include <memory>
#include <string_view>

#include "engine/token_loop.h"
#include "grammar/token_vocabulary.h"
#include "tokenizer/vocab.h"

namespace m40::engine {

// The vocabulary as the grammar engine reads it: each token's bytes
// (control tokens stand for no text, so no grammar can ask for them; a
// template's text-like added tokens such as <tool_call> keep theirs) and
// the end-of-generation tokens. Built once per model and shared.
std::shared_ptr<const grammar::TokenVocabulary> grammar_vocabulary(const tokenizer::Vocab& vocab);

// Parses `gbnf` (grammar::GrammarError when it is not valid) for a
// vocabulary from grammar_vocabulary().
AnswerGrammar answer_grammar(std::string_view gbnf, std::shared_ptr<const grammar::TokenVocabulary> vocabulary);

}  // namespace m40::engine
