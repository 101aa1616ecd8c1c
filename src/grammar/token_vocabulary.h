// A model's vocabulary prepared for grammar masks: each token's bytes, the
// end-of-generation tokens, and a prefix tree of the bytes. Built once per
// model (about 0.1 s for 150k tokens) and shared by every constrained
// sequence; it also keeps the per-grammar token tables of recent grammars so
// that requests with the same grammar or schema reuse them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace m40::grammar {

namespace detail {
class TokenTrie;
class TableRegistry;
}  // namespace detail

class TokenVocabulary {
 public:
  // pieces[i]: exactly the bytes token i appends to the text (empty for
  // control tokens, which grammars never allow). end_of_generation: the
  // tokens that end generation, allowed exactly when the grammar is complete.
  TokenVocabulary(std::vector<std::string> pieces, std::vector<int32_t> end_of_generation);
  ~TokenVocabulary();
  TokenVocabulary(const TokenVocabulary&) = delete;
  TokenVocabulary& operator=(const TokenVocabulary&) = delete;

  size_t size() const { return pieces_.size(); }
  const std::string& piece(int32_t token) const { return pieces_[static_cast<size_t>(token)]; }
  bool is_end_of_generation(int32_t token) const { return is_eog_[static_cast<size_t>(token)]; }
  const std::vector<int32_t>& end_of_generation() const { return end_of_generation_; }

  const detail::TokenTrie& trie() const { return *trie_; }
  detail::TableRegistry& tables() const { return *tables_; }

 private:
  std::vector<std::string> pieces_;
  std::vector<int32_t> end_of_generation_;
  std::vector<bool> is_eog_;
  std::unique_ptr<detail::TokenTrie> trie_;
  std::unique_ptr<detail::TableRegistry> tables_;
};

}  // namespace m40::grammar
