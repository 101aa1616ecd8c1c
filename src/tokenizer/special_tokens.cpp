// Cutting special tokens out of the text before tokenization, with the
// result of llama.cpp's tokenizer_st_partition: the special tokens are taken
// longest first, each claiming its non-overlapping occurrences, left to
// right, in the text the longer ones left. Control and unknown tokens take
// part only when the caller asks to parse special tokens; user-defined ones
// always do (as in the Hugging Face tokenizers).
//
// llama.cpp searches the whole text once per special token; here one pass
// over the text (walking a trie of all their texts) finds which special
// tokens occur at all, and only those are searched for, so a vocabulary with
// thousands of user-defined tokens costs one pass, not thousands.
#include <algorithm>
#include <cctype>
#include <cstring>
#include <map>

#include "tokenizer/vocab_impl.h"

namespace m40::tokenizer {

namespace {
constexpr uint16_t kAttrSpecialText = kAttrControl | kAttrUnknown;
constexpr uint16_t kAttrMatchedWhole = kAttrControl | kAttrUserDefined | kAttrUnknown;
inline bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }
}  // namespace

void SpecialTrie::build(const std::vector<std::string_view>& texts) {
  // Build with maps, then lay out each node's children contiguously.
  struct Draft {
    int32_t rank = -1;
    std::map<uint8_t, uint32_t> children;
  };
  std::vector<Draft> draft(1);
  for (size_t rank = 0; rank < texts.size(); ++rank) {
    uint32_t node = 0;
    for (char c : texts[rank]) {
      const uint8_t b = static_cast<uint8_t>(c);
      auto it = draft[node].children.find(b);
      if (it == draft[node].children.end()) {
        draft.emplace_back();
        it = draft[node].children.emplace(b, static_cast<uint32_t>(draft.size() - 1)).first;
      }
      node = it->second;
    }
    if (draft[node].rank < 0) draft[node].rank = static_cast<int32_t>(rank);
  }
  nodes.assign(draft.size(), Node{});
  children.clear();
  for (size_t i = 0; i < draft.size(); ++i) {
    nodes[i].rank = draft[i].rank;
    nodes[i].first_child = static_cast<uint32_t>(children.size());
    nodes[i].child_count = static_cast<uint32_t>(draft[i].children.size());
    for (const auto& [byte, child] : draft[i].children) children.push_back({byte, child});
  }
  root.assign(256, 0);
  for (const auto& [byte, child] : draft[0].children) root[byte] = child;
}

void Vocab::Impl::build_special_index() {
  special_tokens.clear();
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (tokens[id].attr & kAttrMatchedWhole) special_tokens.push_back(static_cast<TokenId>(id));
  }
  // Longest first; equal lengths by id (llama.cpp leaves that order unspecified).
  std::stable_sort(special_tokens.begin(), special_tokens.end(),
                   [&](TokenId a, TokenId b) { return tokens[a].text.size() > tokens[b].text.size(); });
  std::vector<std::string_view> texts;
  any_user_defined = false;
  for (TokenId id : special_tokens) {
    texts.push_back(tokens[id].text);
    if ((tokens[id].attr & kAttrSpecialText) == 0) any_user_defined = true;
  }
  special_trie.build(texts);
}

void Vocab::Impl::partition(std::string_view text, bool parse_special, std::vector<Fragment>& out) const {
  out.clear();
  const uint32_t n = static_cast<uint32_t>(text.size());
  out.push_back({0, n, kNoToken});
  if (special_tokens.empty() || (!parse_special && !any_user_defined)) return;
  auto takes_part = [&](const TokenData& t) { return parse_special || (t.attr & kAttrSpecialText) == 0; };

  // Which special tokens occur at all (one pass over the text).
  std::vector<uint8_t> present(special_tokens.size(), 0);
  bool any = false;
  for (uint32_t p = 0; p < n; ++p) {
    special_trie.match(text, p, [&](uint32_t rank) {
      if (!present[rank] && takes_part(tokens[special_tokens[rank]])) present[rank] = 1;
      any = true;
    });
  }
  if (!any) return;

  // Longest first, each token claims its leftmost non-overlapping
  // occurrences in the text fragments left over.
  std::vector<Fragment> next;
  for (uint32_t rank = 0; rank < special_tokens.size(); ++rank) {
    if (!present[rank]) continue;
    const TokenId id = special_tokens[rank];
    const TokenData& t = tokens[id];
    const std::string_view needle = t.text;
    next.clear();
    for (const Fragment& f : out) {
      if (f.token != kNoToken) {
        next.push_back(f);
        continue;
      }
      uint32_t begin = f.begin;
      const std::string_view window = text.substr(0, f.end);
      for (size_t found; begin < f.end && (found = window.find(needle, begin)) != std::string_view::npos;) {
        const uint32_t at = static_cast<uint32_t>(found);
        uint32_t left_end = at;
        if (t.attr & kAttrLstrip) {
          while (left_end > begin && is_space(text[left_end - 1])) --left_end;
        }
        if (left_end > begin) next.push_back({begin, left_end, kNoToken});
        next.push_back({at, at + static_cast<uint32_t>(needle.size()), id});
        begin = at + static_cast<uint32_t>(needle.size());
        if (t.attr & kAttrRstrip) {
          while (begin < f.end && is_space(text[begin])) ++begin;
        }
      }
      if (begin < f.end) next.push_back({begin, f.end, kNoToken});
    }
    out.swap(next);
  }
}

}  // namespace m40::tokenizer
