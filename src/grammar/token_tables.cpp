#include "grammar/token_tables.h"

#include <algorithm>

#include "grammar/token_vocabulary.h"

namespace m40::grammar::detail {

TokenTables::TokenTables(std::shared_ptr<const Grammar> grammar, const TokenVocabulary& vocab)
    : grammar_(std::move(grammar)),
      vocab_(vocab),
      masks_(grammar_->automaton().states.size()),
      owned_(grammar_->automaton().states.size()),
      store_(std::shared_ptr<const Automaton>(grammar_, &grammar_->automaton())) {}

uint32_t TokenTables::need_of(ConfigId config) {
  if (const uint32_t* found = need_memo_.find(config)) return *found;
  uint32_t need = ~uint32_t{0};
  for (NodeId n : store_.stacks(config)) {
    NodeId bottom = n;
    while (store_.parent(bottom) != kCeiling) bottom = store_.parent(bottom);
    const uint32_t c = store_.count(bottom);
    const uint32_t path_need = (c & kRelativeCount) != 0 ? (c & kCountMask) + 1 : (c & kExitedCount) != 0 ? (c & kCountMask) : 0;
    need = std::min(need, path_need);
  }
  if (store_.escaped(config)) need = std::min(need, store_.escape_needs(config).front());
  need_memo_.insert(config, need);
  return need;
}

const PositionMask& TokenTables::compute(uint32_t state) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (owned_[state]) return *owned_[state];
  auto mask = std::make_unique<PositionMask>();
  const std::vector<TrieNode>& nodes = vocab_.trie().nodes();
  const std::vector<int32_t>& tokens = vocab_.trie().tokens();
  const bool counted = grammar_->automaton().states[state].loop != kNoLoop;
  std::vector<int32_t> accepted;
  std::vector<std::pair<uint32_t, int32_t>> needs;  // (need, token) in a counted loop
  std::vector<PositionMask::Escape> escapes;        // escape node, need
  // Per depth of the trie path: the configuration and the relative count
  // subtracted from it on the way (see StackStore::step).
  path_.assign(1, store_.isolated(state));
  added_.assign(1, 0);
  for (uint32_t i = 1; i < nodes.size();) {
    const TrieNode& node = nodes[i];
    uint32_t added = added_[node.depth - 1];
    const ConfigId c = store_.step(path_[node.depth - 1], node.byte, added);
    if (c == kDead) {
      i = node.subtree_end;
      continue;
    }
    if (path_.size() <= node.depth) {
      path_.resize(node.depth + 1);
      added_.resize(node.depth + 1);
    }
    path_[node.depth] = c;
    added_[node.depth] = added;
    if (node.tokens_here > 0) {
      const uint32_t need = counted ? added + need_of(c) : 0;
      for (uint32_t k = 0; k < node.tokens_here; ++k) {
        const int32_t t = tokens[node.first_token + k];
        accepted.push_back(t);
        if (counted) needs.push_back({need, t});
      }
    }
    if (node.subtree_end > i + 1) {
      for (uint32_t need : store_.escape_needs(c)) escapes.push_back({i, added + need});
    }
    i = store_.has_stacks(c) ? i + 1 : node.subtree_end;
  }
  const size_t vocab_size = vocab_.size();
  if (accepted.size() * 32 > vocab_size) {
    mask->accepted_bits.assign((vocab_size + 63) / 64, 0);
    for (int32_t t : accepted) mask->accepted_bits[static_cast<size_t>(t) >> 6] |= uint64_t{1} << (t & 63);
  } else {
    std::sort(accepted.begin(), accepted.end());
    mask->accepted_list = std::move(accepted);
  }
  if (counted && !needs.empty()) {
    // Grouped by need (a counting sort: needs are small, tokens many).
    uint32_t max_need = 0;
    for (const auto& [need, t] : needs) max_need = std::max(max_need, need);
    mask->max_need = max_need;
    mask->need_start.assign(max_need + 2, 0);
    for (const auto& [need, t] : needs) ++mask->need_start[need + 1];
    for (size_t k = 1; k < mask->need_start.size(); ++k) mask->need_start[k] += mask->need_start[k - 1];
    mask->by_need.resize(needs.size());
    std::vector<uint32_t> next(mask->need_start.begin(), mask->need_start.end() - 1);
    for (const auto& [need, t] : needs) mask->by_need[next[need]++] = t;
  }
  if (!escapes.empty()) {
    // The children of each escape node, grouped by their byte.
    std::vector<std::pair<uint8_t, PositionMask::Escape>> children;
    for (const auto& e : escapes) {
      for (uint32_t k = e.node + 1; k < nodes[e.node].subtree_end; k = nodes[k].subtree_end) {
        children.push_back({nodes[k].byte, {k, e.need}});
      }
    }
    mask->escape_start.assign(257, 0);
    for (const auto& [b, e] : children) ++mask->escape_start[b + 1u];
    for (size_t k = 1; k < 257; ++k) mask->escape_start[k] += mask->escape_start[k - 1];
    mask->escapes.resize(children.size());
    std::vector<uint32_t> next(mask->escape_start.begin(), mask->escape_start.end() - 1);
    for (const auto& [b, e] : children) mask->escapes[next[b]++] = e;
  }
  owned_[state] = std::move(mask);
  masks_[state].store(owned_[state].get(), std::memory_order_release);
  return *owned_[state];
}

size_t TokenTables::memory_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t total = store_.memory_bytes() + masks_.size() * 16;
  for (const auto& m : owned_) total += m ? m->memory_bytes() + sizeof(PositionMask) : 0;
  return total;
}

size_t TokenTables::positions_computed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<size_t>(std::count_if(owned_.begin(), owned_.end(), [](const auto& m) { return m != nullptr; }));
}

std::shared_ptr<TokenTables> TableRegistry::get(const std::shared_ptr<const Grammar>& grammar) {
  std::string key = grammar->root();
  key += '\n';
  key += grammar->source();
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = by_text_.find(key); it != by_text_.end()) {
    if (auto tables = it->second.lock()) return tables;
  }
  auto tables = std::make_shared<TokenTables>(grammar, vocab_);
  by_text_[key] = tables;
  recent_.push_back(tables);
  size_t bytes = 0;
  for (const auto& t : recent_) bytes += t->memory_bytes();
  while (recent_.size() > kKeepRecent || (recent_.size() > 1 && bytes > kKeepBytes)) {
    bytes -= recent_.front()->memory_bytes();
    recent_.pop_front();
  }
  std::erase_if(by_text_, [](const auto& entry) { return entry.second.expired(); });
  return tables;
}

}  // namespace m40::grammar::detail
