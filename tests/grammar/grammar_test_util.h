// Helpers shared by the grammar tests: whole-text matching, a deliberately
// plain reference matcher to check the fast paths against, and the shared
// vocabularies.
#pragma once

#include <algorithm>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/gbnf_builder.h"
#include "grammar/gbnf_parser.h"
#include "grammar/grammar_compiler.h"
#include "grammar/grammar.h"
#include "grammar/grammar_matcher.h"
#include "grammar/token_vocabulary.h"
#include "test_paths.h"
#include "tokenizer/vocab.h"

namespace m40::grammar::test {

inline bool matches(std::string_view gbnf, std::string_view text) {
  return GrammarMatcher::matches(parse_gbnf(gbnf), text);
}

inline bool schema_matches(const nlohmann::ordered_json& schema, std::string_view text) {
  return GrammarMatcher::matches(parse_gbnf(json_schema_to_gbnf(schema)), text);
}

// The grammar compiled in the plain form: every repetition copied, no
// counted loops.
inline std::shared_ptr<const detail::Automaton> plain_automaton(const Grammar& g) {
  return detail::compile_grammar(detail::parse_gbnf_text(g.source()), g.root(), {.counted_loops = false});
}

// A pushdown matcher with explicit stacks (bottom .. top), no sharing, no
// memo and no counted loops (it runs the plain form of the grammar): slow and
// obviously right, the reference for masks.
class ReferenceMatcher {
 public:
  explicit ReferenceMatcher(const Grammar& g) : plain_(plain_automaton(g)), a_(*plain_) {
    close({a_.root_start()}, stacks_, can_end_);
  }

  bool accepts(std::string_view bytes) const {
    std::set<std::vector<uint32_t>> cur = stacks_;
    bool end = can_end_;
    for (char ch : bytes) {
      std::set<std::vector<uint32_t>> next;
      end = false;
      const auto b = static_cast<uint8_t>(ch);
      for (const auto& stack : cur) {
        for (const detail::ByteEdge& e : a_.byte_edges(stack.back())) {
          if (e.lo <= b && b <= e.hi) {
            std::vector<uint32_t> moved = stack;
            moved.back() = e.target;
            close(moved, next, end);
          }
        }
      }
      if (next.empty() && !end) return false;
      cur = std::move(next);
    }
    return true;
  }
  bool can_end() const { return can_end_; }
  void advance(std::string_view bytes) {
    for (char ch : bytes) {
      std::set<std::vector<uint32_t>> next;
      bool end = false;
      const auto b = static_cast<uint8_t>(ch);
      for (const auto& stack : stacks_) {
        for (const detail::ByteEdge& e : a_.byte_edges(stack.back())) {
          if (e.lo <= b && b <= e.hi) {
            std::vector<uint32_t> moved = stack;
            moved.back() = e.target;
            close(moved, next, end);
          }
        }
      }
      stacks_ = std::move(next);
      can_end_ = end;
    }
  }

 private:
  void close(std::vector<uint32_t> stack, std::set<std::vector<uint32_t>>& out, bool& end) const {
    const uint32_t q = stack.back();
    if (!a_.loops.empty() || a_.states[q].loop_end != detail::kNoLoop) throw std::logic_error("plain grammars have no loops");
    if (a_.consumes(q)) out.insert(stack);
    for (const detail::CallEdge& c : a_.call_edges(q)) {
      std::vector<uint32_t> called = stack;
      called.back() = c.return_state;
      called.push_back(a_.rule_start[c.rule]);
      close(called, out, end);
    }
    if (a_.states[q].final) {
      stack.pop_back();
      if (stack.empty()) {
        end = true;
      } else {
        close(stack, out, end);
      }
    }
  }

  std::shared_ptr<const detail::Automaton> plain_;
  const detail::Automaton& a_;
  std::set<std::vector<uint32_t>> stacks_;
  bool can_end_ = false;
};

// A real model vocabulary (shared/models/vocab), loaded once; null if absent.
struct LoadedVocab {
  std::unique_ptr<tokenizer::Vocab> tokenizer;
  std::shared_ptr<const TokenVocabulary> vocab;
};

inline const LoadedVocab* load_vocab(const std::string& name) {
  static std::vector<std::pair<std::string, std::unique_ptr<LoadedVocab>>> cache;
  for (const auto& [n, v] : cache) {
    if (n == name) return v.get();
  }
  const auto path = m40::test::shared_model("vocab/ggml-vocab-" + name + ".gguf");
  std::unique_ptr<LoadedVocab> loaded;
  if (std::filesystem::exists(path)) {
    loaded = std::make_unique<LoadedVocab>();
    loaded->tokenizer = std::make_unique<tokenizer::Vocab>(tokenizer::Vocab::from_file(path.string()));
    const tokenizer::Vocab& v = *loaded->tokenizer;
    std::vector<std::string> pieces(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      const auto id = static_cast<tokenizer::TokenId>(i);
      if (!v.is_control(id)) pieces[i] = v.piece(id);
    }
    loaded->vocab = std::make_shared<TokenVocabulary>(std::move(pieces), v.end_of_generation_tokens());
  }
  cache.emplace_back(name, std::move(loaded));
  return cache.back().second.get();
}

// Token ids whose pieces spell exactly `text`, as a model would continue
// after a prompt: the vocabulary's own tokenization, without the space that
// SentencePiece vocabularies put before the first word.
inline std::vector<int32_t> continuation_tokens(const LoadedVocab& v, const std::string& text) {
  const tokenizer::EncodeOptions options{.add_special = false};
  auto spell = [&](const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t id : ids) s += v.vocab->piece(id);
    return s;
  };
  std::vector<int32_t> ids = v.tokenizer->encode(text, options);
  if (spell(ids) == text) return ids;
  // SentencePiece: tokenize "\n" + text and drop the tokens of the prefix.
  ids = v.tokenizer->encode("\n" + text, options);
  std::string prefix;
  size_t k = 0;
  while (k < ids.size() && prefix != "\n" && prefix != " \n" && prefix.size() < 3) prefix += v.vocab->piece(ids[k++]);
  std::vector<int32_t> rest(ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end());
  if (spell(rest) == text) return rest;
  return {};
}

}  // namespace m40::grammar::test
