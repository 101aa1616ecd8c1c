#include "grammar/token_trie.h"

#include <algorithm>
#include <string_view>

#include "grammar/grammar.h"

namespace m40::grammar::detail {

TokenTrie::TokenTrie(const std::vector<std::string>& pieces, const std::vector<bool>& excluded) {
  constexpr size_t kMaxPiece = 0xFFFF;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].empty() || excluded[i]) continue;
    if (pieces[i].size() > kMaxPiece) throw GrammarError("token " + std::to_string(i) + " is longer than 65535 bytes");
    tokens_.push_back(static_cast<int32_t>(i));
  }
  auto bytes = [&](int32_t t) {
    const std::string& p = pieces[static_cast<size_t>(t)];
    return std::basic_string_view<unsigned char>(reinterpret_cast<const unsigned char*>(p.data()), p.size());
  };
  std::stable_sort(tokens_.begin(), tokens_.end(), [&](int32_t a, int32_t b) { return bytes(a) < bytes(b); });

  nodes_.push_back({0, 0, 0, 0, 0});
  std::vector<uint32_t> path{0};  // node at each depth of the current path
  std::basic_string_view<unsigned char> prev;
  for (size_t k = 0; k < tokens_.size(); ++k) {
    const auto s = bytes(tokens_[k]);
    size_t common = 0;
    while (common < s.size() && common < prev.size() && s[common] == prev[common]) ++common;
    path.resize(common + 1);
    for (size_t d = common + 1; d <= s.size(); ++d) {
      path.push_back(static_cast<uint32_t>(nodes_.size()));
      nodes_.push_back({0, static_cast<uint32_t>(k), static_cast<uint16_t>(d), s[d - 1], 0});
    }
    TrieNode& end = nodes_[path[s.size()]];
    if (end.tokens_here == 255) throw GrammarError("more than 255 tokens with the same bytes");
    ++end.tokens_here;
    prev = s;
  }
  // Subtree ends: a node's subtree ends at the next node no deeper than it.
  std::vector<uint32_t> open;
  for (uint32_t i = 0; i < nodes_.size(); ++i) {
    while (!open.empty() && nodes_[open.back()].depth >= nodes_[i].depth) {
      nodes_[open.back()].subtree_end = i;
      open.pop_back();
    }
    open.push_back(i);
  }
  for (uint32_t i : open) nodes_[i].subtree_end = static_cast<uint32_t>(nodes_.size());
}

}  // namespace m40::grammar::detail
