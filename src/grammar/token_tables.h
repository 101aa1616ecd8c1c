// What each automaton state allows of a vocabulary, computed once per
// (grammar, vocabulary) and shared by all sequences using the grammar.
//
// The idea (from XGrammar's adaptive token mask cache): for a stack whose top
// is at state s, most tokens are decided by s's own rule alone. Walking the
// token trie from s with nothing known below it sorts every token into
//   accepted  - some path consumes all its bytes inside the rule (or returns
//               from the rule exactly at its last byte): allowed whatever lies
//               below;
//   escaping  - a path returns from the rule with bytes left: allowed or not
//               depending on the stack below; kept as the trie nodes where the
//               return happens, whose subtrees are walked at run time from the
//               caller's state;
//   rejected  - everything else.
// Inside a JSON string, say, nearly every token is accepted from the table;
// only tokens like `",` that close the string and go on are walked per use.
//
// A state inside a counted loop (`char{0,500}`) serves every count: its table
// also records how many iterations each token needs, and a sequence with
// `budget` iterations left allows the tokens needing no more than that.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/stack_store.h"
#include "grammar/token_trie.h"

namespace m40::grammar {
class TokenVocabulary;
}

namespace m40::grammar::detail {

struct PositionMask {
  // Accepted tokens: a sorted list when few, else a bitset over the vocabulary.
  std::vector<int32_t> accepted_list;
  std::vector<uint64_t> accepted_bits;
  // In a counted loop: the accepted tokens by the iterations they need,
  // ascending (need_start[k]: the first needing k or more), and the most any
  // needs. Empty outside loops (nothing to count).
  std::vector<int32_t> by_need;
  std::vector<uint32_t> need_start;
  uint32_t max_need = 0;
  // Where a path has returned from the rule with bytes left: the trie nodes
  // just past the return (their tokens continue in the caller), grouped by
  // their byte so that a caller walks only the bytes it can take next
  // (escapes[escape_start[b] .. escape_start[b+1]) lead with byte b), with
  // the iterations the path needed. Empty when no path returns early.
  struct Escape {
    uint32_t node;
    uint32_t need;
  };
  std::vector<Escape> escapes;
  std::vector<uint32_t> escape_start;
  size_t memory_bytes() const {
    return accepted_list.capacity() * 4 + accepted_bits.capacity() * 8 + by_need.capacity() * 4 + need_start.capacity() * 4 +
           escapes.capacity() * sizeof(Escape) + escape_start.capacity() * 4;
  }
};

class TokenTables {
 public:
  TokenTables(std::shared_ptr<const Grammar> grammar, const TokenVocabulary& vocab);

  const Grammar& grammar() const { return *grammar_; }
  std::shared_ptr<const Grammar> grammar_ptr() const { return grammar_; }
  const TokenVocabulary& vocab() const { return vocab_; }

  // The table of a state that consumes bytes; computed on first use
  // (thread-safe), then read without locking.
  const PositionMask& position(uint32_t state) {
    const PositionMask* m = masks_[state].load(std::memory_order_acquire);
    return m != nullptr ? *m : compute(state);
  }

  size_t memory_bytes() const;
  size_t positions_computed() const;

 private:
  const PositionMask& compute(uint32_t state);
  // The fewest iterations of the walk's loop the paths of `config` needed.
  uint32_t need_of(ConfigId config);

  std::shared_ptr<const Grammar> grammar_;
  const TokenVocabulary& vocab_;
  std::vector<std::atomic<const PositionMask*>> masks_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<PositionMask>> owned_;  // guarded by mutex_
  StackStore store_;                                  // guarded by mutex_
  std::vector<ConfigId> path_;                        // guarded by mutex_
  std::vector<uint32_t> added_;                       // guarded by mutex_
  FlatMap64 need_memo_;                               // guarded by mutex_
};

// The tables of recently used grammars of one vocabulary, found by grammar
// text, so that a request repeating a schema does not compute them again.
class TableRegistry {
 public:
  explicit TableRegistry(const TokenVocabulary& vocab) : vocab_(vocab) {}
  std::shared_ptr<TokenTables> get(const std::shared_ptr<const Grammar>& grammar);

 private:
  // Recent tables kept alive beyond their users: at most this many, and
  // older ones dropped first while together they hold more than this.
  static constexpr size_t kKeepRecent = 8;
  static constexpr size_t kKeepBytes = size_t{64} << 20;
  const TokenVocabulary& vocab_;
  std::mutex mutex_;
  std::unordered_map<std::string, std::weak_ptr<TokenTables>> by_text_;
  std::deque<std::shared_ptr<TokenTables>> recent_;
};

}  // namespace m40::grammar::detail
