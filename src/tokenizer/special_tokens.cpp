// Cutting special tokens out of the text before tokenization, with the
// result of llama.cpp's tokenizer_st_partition: the special tokens are taken
// longest first, each claiming its non-overlapping occurrences, left to
// right, in the text the longer ones left. Control and unknown tokens take
// part only when the caller asks to parse special tokens; user-defined ones
// always do (as in the Hugging Face tokenizers).
//
// llama.cpp rescans the whole text once per special token; here one pass
// collects every occurrence of every special token (walking a trie),
// and the claims are then resolved in that same order, so a vocabulary with
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
  if (special_tokens.empty() || (!parse_special && !any_user_defined)) {
    out.push_back({0, n, kNoToken});
    return;
  }
  auto takes_part = [&](const TokenData& t) { return parse_special || (t.attr & kAttrSpecialText) == 0; };

  // Every occurrence of every special token that takes part, as (rank, position).
  struct Occurrence {
    uint32_t rank;
    uint32_t position;
  };
  std::vector<Occurrence> found;
  for (uint32_t p = 0; p < n; ++p) {
    special_trie.match(text, p, [&](uint32_t rank) {
      if (takes_part(tokens[special_tokens[rank]])) found.push_back({rank, p});
    });
  }
  if (found.empty()) {
    out.push_back({0, n, kNoToken});
    return;
  }
  std::sort(found.begin(), found.end(), [](const Occurrence& a, const Occurrence& b) {
    return a.rank != b.rank ? a.rank < b.rank : a.position < b.position;
  });

  // Claim: an occurrence wins if none of its bytes is taken yet. Spaces that
  // an lstrip/rstrip token swallows are taken too (they vanish from the text).
  enum : uint8_t { kFree = 0, kTaken = 1 };
  std::vector<uint8_t> state(n, kFree);
  std::vector<Fragment> claimed;
  for (const Occurrence& o : found) {
    const TokenId id = special_tokens[o.rank];
    const TokenData& t = tokens[id];
    const uint32_t end = o.position + static_cast<uint32_t>(t.text.size());
    bool free = true;
    for (uint32_t i = o.position; i < end && free; ++i) free = state[i] == kFree;
    if (!free) continue;
    std::memset(state.data() + o.position, kTaken, end - o.position);
    claimed.push_back({o.position, end, id});
    if (t.attr & kAttrLstrip) {
      for (uint32_t i = o.position; i > 0 && state[i - 1] == kFree && is_space(text[i - 1]); --i) state[i - 1] = kTaken;
    }
    if (t.attr & kAttrRstrip) {
      for (uint32_t i = end; i < n && state[i] == kFree && is_space(text[i]); ++i) state[i] = kTaken;
    }
  }
  std::sort(claimed.begin(), claimed.end(), [](const Fragment& a, const Fragment& b) { return a.begin < b.begin; });

  // Text between the claimed tokens, minus swallowed spaces.
  auto add_text = [&](uint32_t begin, uint32_t end) {
    uint32_t i = begin;
    while (i < end) {
      while (i < end && state[i] != kFree) ++i;
      const uint32_t start = i;
      while (i < end && state[i] == kFree) ++i;
      if (i > start) out.push_back({start, i, kNoToken});
    }
  };
  uint32_t cursor = 0;
  for (const Fragment& c : claimed) {
    add_text(cursor, c.begin);
    out.push_back(c);
    cursor = c.end;
  }
  add_text(cursor, n);
}

}  // namespace m40::tokenizer
