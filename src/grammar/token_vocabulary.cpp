#include "grammar/token_vocabulary.h"

#include "grammar/grammar.h"
#include "grammar/token_tables.h"
#include "grammar/token_trie.h"

namespace m40::grammar {

TokenVocabulary::TokenVocabulary(std::vector<std::string> pieces, std::vector<int32_t> end_of_generation)
    : pieces_(std::move(pieces)), end_of_generation_(std::move(end_of_generation)), is_eog_(pieces_.size(), false) {
  for (int32_t t : end_of_generation_) {
    if (t < 0 || static_cast<size_t>(t) >= pieces_.size()) {
      throw GrammarError("end-of-generation token " + std::to_string(t) + " is outside the vocabulary of " +
                         std::to_string(pieces_.size()) + " tokens");
    }
    is_eog_[static_cast<size_t>(t)] = true;
  }
  trie_ = std::make_unique<detail::TokenTrie>(pieces_, is_eog_);
  tables_ = std::make_unique<detail::TableRegistry>(*this);
}

TokenVocabulary::~TokenVocabulary() = default;

}  // namespace m40::grammar
