// Internal: the merge loop shared by SPM and BPE. Repeatedly merge the best
// adjacent pair of symbols (highest priority; on a tie the leftmost) until
// no adjacent pair can merge. SPM's priority is the merged token's score,
// BPE's the negated merge rank; this is the order of llama.cpp's work queues
// and of the Hugging Face and SentencePiece implementations.
//
// Short runs rescan a small array (fast for ordinary words); long runs, where
// that would be quadratic, use a priority queue with lazy invalidation:
// O(n log n) for a megabyte-long word. Both orders are the same.
#pragma once

#include <cstdint>
#include <queue>
#include <vector>

#include "tokenizer/vocab_impl.h"

namespace m40::tokenizer {

struct Symbol {
  int32_t id;      // token id, or a virtual id for a string that is not a token
  uint32_t start;  // byte offset in the merged text
  uint32_t len;    // byte length
};

// lookup(left_id, right_id, priority&, merged_id&) -> bool: whether the pair
// merges, and into what.
template <class Priority, class Lookup>
void merge_symbols(std::vector<Symbol>& symbols, const Lookup& lookup) {
  const size_t n = symbols.size();
  if (n < 2) return;

  if (n <= linear_merge_limit()) {
    struct Pair {
      bool merges;
      Priority priority;
      int32_t result;
    };
    // pairs[i] is the pair (symbols[i], symbols[i + 1]).
    Pair pairs[64];
    Symbol local[64];
    size_t count = n;
    std::vector<Pair> pair_storage;
    std::vector<Symbol> symbol_storage;
    Pair* p = pairs;
    Symbol* s = local;
    if (n > 64) {
      pair_storage.resize(n);
      symbol_storage.assign(symbols.begin(), symbols.end());
      p = pair_storage.data();
      s = symbol_storage.data();
    } else {
      for (size_t i = 0; i < n; ++i) s[i] = symbols[i];
    }
    auto evaluate = [&](size_t i) { p[i].merges = lookup(s[i].id, s[i + 1].id, p[i].priority, p[i].result); };
    for (size_t i = 0; i + 1 < count; ++i) evaluate(i);
    while (count > 1) {
      size_t best = count;
      for (size_t i = 0; i + 1 < count; ++i) {
        if (p[i].merges && (best == count || p[i].priority > p[best].priority)) best = i;
      }
      if (best == count) break;
      s[best].id = p[best].result;
      s[best].len += s[best + 1].len;
      for (size_t i = best + 1; i + 1 < count; ++i) s[i] = s[i + 1];
      for (size_t i = best; i + 2 < count; ++i) p[i] = p[i + 1];
      --count;
      if (best > 0) evaluate(best - 1);
      if (best + 1 < count) evaluate(best);
    }
    symbols.assign(s, s + count);
    return;
  }

  struct Node {
    Symbol symbol;
    int32_t prev;
    int32_t next;
  };
  struct Candidate {
    Priority priority;
    int32_t left;
    int32_t right;
    int32_t left_id;
    int32_t right_id;
    int32_t result;
  };
  struct Worse {
    bool operator()(const Candidate& a, const Candidate& b) const {
      return a.priority < b.priority || (a.priority == b.priority && a.left > b.left);
    }
  };
  std::vector<Node> nodes(n);
  for (size_t i = 0; i < n; ++i) {
    nodes[i] = {symbols[i], static_cast<int32_t>(i) - 1, i + 1 < n ? static_cast<int32_t>(i + 1) : -1};
  }
  std::vector<Candidate> heap_storage;
  heap_storage.reserve(n);
  std::priority_queue<Candidate, std::vector<Candidate>, Worse> queue(Worse{}, std::move(heap_storage));
  auto consider = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    Candidate c;
    c.left = left;
    c.right = right;
    c.left_id = nodes[left].symbol.id;
    c.right_id = nodes[right].symbol.id;
    if (lookup(c.left_id, c.right_id, c.priority, c.result)) queue.push(c);
  };
  for (size_t i = 0; i + 1 < n; ++i) consider(static_cast<int32_t>(i), static_cast<int32_t>(i + 1));
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Node& left = nodes[c.left];
    Node& right = nodes[c.right];
    // Stale: one side was merged away or has grown since.
    if (left.symbol.len == 0 || right.symbol.len == 0 || left.next != c.right || left.symbol.id != c.left_id ||
        right.symbol.id != c.right_id) {
      continue;
    }
    left.symbol.id = c.result;
    left.symbol.len += right.symbol.len;
    right.symbol.len = 0;
    left.next = right.next;
    if (right.next >= 0) nodes[right.next].prev = c.left;
    consider(left.prev, c.left);
    consider(c.left, left.next);
  }
  symbols.clear();
  for (int32_t i = 0; i >= 0; i = nodes[i].next) symbols.push_back(nodes[i].symbol);
}

}  // namespace m40::tokenizer
