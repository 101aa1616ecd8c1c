#include "grammar/token_constraint.h"

#include <algorithm>
#include <limits>
#include <list>
#include <unordered_map>

#include "grammar/automaton.h"
#include "grammar/stack_store.h"
#include "grammar/token_tables.h"
#include "grammar/token_trie.h"

namespace m40::grammar {

namespace {

using detail::ConfigId;
using detail::kDead;

// Masks of recent configurations, least recently used dropped first. Inside
// a string or between the fields of an object the same configurations come
// back again and again.
class MaskCache {
 public:
  explicit MaskCache(size_t entries) : capacity_(std::max<size_t>(entries, 1)) {}

  const std::vector<uint64_t>* find(ConfigId config) {
    auto it = index_.find(config);
    if (it == index_.end()) return nullptr;
    lru_.splice(lru_.begin(), lru_, it->second);
    return &it->second->second;
  }

  std::vector<uint64_t>& insert(ConfigId config) {
    std::vector<uint64_t> storage;
    if (index_.size() >= capacity_) {
      index_.erase(lru_.back().first);
      storage = std::move(lru_.back().second);
      lru_.pop_back();
    }
    lru_.emplace_front(config, std::move(storage));
    index_[config] = lru_.begin();
    return lru_.front().second;
  }

  void clear() {
    lru_.clear();
    index_.clear();
  }

 private:
  size_t capacity_;
  std::list<std::pair<ConfigId, std::vector<uint64_t>>> lru_;
  std::unordered_map<ConfigId, std::list<std::pair<ConfigId, std::vector<uint64_t>>>::iterator> index_;
};

// Cached masks per sequence, in bytes.
constexpr size_t kMaskCacheBytes = size_t{2} << 20;
// Past this many configurations the sequence's store is rebuilt around the
// current one, bounding its memory on long generations.
constexpr size_t kCompactAfterConfigs = 16384;

std::string describe_token(int32_t token, const std::string& piece) {
  std::string shown;
  for (char ch : piece) {
    const auto b = static_cast<uint8_t>(ch);
    if (ch == '\n') {
      shown += "\\n";
    } else if (ch == '"' || ch == '\\') {
      shown += '\\';
      shown += ch;
    } else if (b < 0x20 || b == 0x7F) {
      static constexpr char kHex[] = "0123456789abcdef";
      shown += "\\x";
      shown += kHex[b >> 4];
      shown += kHex[b & 15];
    } else {
      shown += ch;
    }
  }
  return "token " + std::to_string(token) + " (\"" + shown + "\")";
}

// -inf for every refused token of the first 64 * words logits. (The
// popcount picks the cheaper way per block; on x86-64 a copy of this
// function for CPUs with POPCNT is chosen at load time.)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("popcnt", "default")))
#endif
void apply_mask(float* out, const uint64_t* bits, size_t words) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (size_t w = 0; w < words; ++w) {
    const uint64_t word = bits[w];
    if (word == ~uint64_t{0}) continue;
    float* block = out + w * 64;
    if (__builtin_popcountll(word) <= 32) {
      // Mostly refused (JSON punctuation, keys): fill the block and put the
      // few allowed logits back, rather than one scattered store per token.
      float kept[64];
      int k = 0;
      for (uint64_t allowed = word; allowed != 0; allowed &= allowed - 1) kept[k++] = block[__builtin_ctzll(allowed)];
      std::fill_n(block, 64, kNegInf);
      k = 0;
      for (uint64_t allowed = word; allowed != 0; allowed &= allowed - 1) block[__builtin_ctzll(allowed)] = kept[k++];
    } else {
      for (uint64_t refused = ~word; refused != 0; refused &= refused - 1) block[__builtin_ctzll(refused)] = kNegInf;
    }
  }
}

}  // namespace

struct TokenConstraint::State {
  State(std::shared_ptr<const TokenVocabulary> v, std::shared_ptr<detail::TokenTables> t)
      : vocab(std::move(v)),
        tables(std::move(t)),
        store(std::shared_ptr<const detail::Automaton>(tables->grammar_ptr(), &tables->grammar().automaton())),
        words((vocab->size() + 63) / 64),
        cache(kMaskCacheBytes / (std::max<size_t>(words, 1) * 8)) {
    config = store.initial();
  }

  std::shared_ptr<const TokenVocabulary> vocab;
  std::shared_ptr<detail::TokenTables> tables;
  detail::StackStore store;
  ConfigId config = kDead;
  bool ended = false;
  size_t words;
  MaskCache cache;
  std::vector<uint64_t> ended_bits;
  std::vector<detail::NodeId> stacks;
  struct Walk {
    ConfigId after;
    uint32_t state;
    uint32_t budget;
    auto operator<=>(const Walk&) const = default;
  };
  std::vector<Walk> walks;
  std::vector<ConfigId> path;
  std::vector<uint64_t> scratch;

  const std::vector<uint64_t>& bits_for(ConfigId c) {
    if (const auto* found = cache.find(c)) return *found;
    std::vector<uint64_t>& bits = cache.insert(c);
    compute(c, bits);
    return bits;
  }

  void set_eog(std::vector<uint64_t>& bits) const {
    for (int32_t t : vocab->end_of_generation()) bits[static_cast<size_t>(t) >> 6] |= uint64_t{1} << (t & 63);
  }

  static void set_bit(std::vector<uint64_t>& bits, int32_t t) {
    bits[static_cast<size_t>(t) >> 6] |= uint64_t{1} << (t & 63);
  }

  // The accepted tokens of a position, given the iterations of its counted
  // loop still allowed (no limit outside loops).
  void add_accepted(const detail::PositionMask& pm, uint32_t budget, std::vector<uint64_t>& bits) {
    if (budget >= pm.max_need) {
      if (!pm.accepted_bits.empty()) {
        const uint64_t* src = pm.accepted_bits.data();
        uint64_t* dst = bits.data();
        for (size_t w = 0; w < words; ++w) dst[w] |= src[w];
      } else {
        for (int32_t t : pm.accepted_list) set_bit(bits, t);
      }
      return;
    }
    const size_t allowed = pm.need_start[budget + 1];
    const size_t total = pm.by_need.size();
    if (pm.accepted_bits.empty() || allowed <= total - allowed) {
      for (size_t k = 0; k < allowed; ++k) set_bit(bits, pm.by_need[k]);
      return;
    }
    // Most are allowed: all of them, less those needing too many.
    scratch.assign(pm.accepted_bits.begin(), pm.accepted_bits.end());
    for (size_t k = allowed; k < total; ++k) {
      const int32_t t = pm.by_need[k];
      scratch[static_cast<size_t>(t) >> 6] &= ~(uint64_t{1} << (t & 63));
    }
    for (size_t w = 0; w < words; ++w) bits[w] |= scratch[w];
  }

  void compute(ConfigId c, std::vector<uint64_t>& bits) {
    const detail::Automaton& a = tables->grammar().automaton();
    bits.assign(words, 0);
    const auto span = store.stacks(c);
    stacks.assign(span.begin(), span.end());  // the store grows during the walks below
    walks.clear();
    for (detail::NodeId n : stacks) {
      const uint32_t q = store.state(n);
      const detail::PositionMask& pm = tables->position(q);
      const uint32_t loop = a.states[q].loop;
      const uint32_t budget = loop == detail::kNoLoop ? ~uint32_t{0} : a.loops[loop].max - store.count(n);
      add_accepted(pm, budget, bits);
      const detail::NodeId parent = store.parent(n);
      if (pm.escapes.empty() || parent == detail::kBottom) continue;  // nothing follows the root
      const ConfigId after = store.after_return(parent);
      if (after != kDead) walks.push_back({after, q, budget});
    }
    // Stacks at the same state over the same caller need one walk.
    std::sort(walks.begin(), walks.end());
    walks.erase(std::unique(walks.begin(), walks.end()), walks.end());
    for (const Walk& w : walks) {
      const detail::PositionMask& pm = tables->position(w.state);
      const auto& start = pm.escape_start;
      for (unsigned b = 0; b < 256; ++b) {
        if (start[b] == start[b + 1] || !takes_byte(w.after, static_cast<uint8_t>(b))) continue;
        const ConfigId next = store.step(w.after, static_cast<uint8_t>(b));
        if (next == kDead) continue;
        for (uint32_t k = start[b]; k < start[b + 1]; ++k) {
          if (pm.escapes[k].need <= w.budget) walk(next, pm.escapes[k].node, bits);
        }
      }
    }
    if (store.can_end(c)) set_eog(bits);
  }

  // Whether some stack of `from` has an edge on `byte` (then the step
  // leads somewhere: every state can still complete).
  bool takes_byte(ConfigId from, uint8_t byte) {
    const detail::Automaton& a = tables->grammar().automaton();
    for (detail::NodeId n : store.stacks(from)) {
      for (const detail::ByteEdge& e : a.byte_edges(store.state(n))) {
        if (e.lo > byte) break;
        if (e.hi >= byte) return true;
      }
    }
    return false;
  }

  // The tokens at and below trie node x, whose bytes up to x lead to
  // configuration `at` (alive).
  void walk(ConfigId at, uint32_t x, std::vector<uint64_t>& bits) {
    const std::vector<detail::TrieNode>& nodes = vocab->trie().nodes();
    const std::vector<int32_t>& tokens = vocab->trie().tokens();
    for (uint32_t k = 0; k < nodes[x].tokens_here; ++k) set_bit(bits, tokens[nodes[x].first_token + k]);
    if (!store.has_stacks(at)) return;
    const uint32_t end = nodes[x].subtree_end;
    if (path.size() <= nodes[x].depth) path.resize(nodes[x].depth + 1);
    path[nodes[x].depth] = at;
    for (uint32_t j = x + 1; j < end;) {
      const detail::TrieNode& node = nodes[j];
      const ConfigId c = store.step(path[node.depth - 1], node.byte);
      if (c == kDead) {
        j = node.subtree_end;
        continue;
      }
      if (path.size() <= node.depth) path.resize(node.depth + 1);
      path[node.depth] = c;
      for (uint32_t k = 0; k < node.tokens_here; ++k) set_bit(bits, tokens[node.first_token + k]);
      j = store.has_stacks(c) ? j + 1 : node.subtree_end;
    }
  }

  ConfigId advance(ConfigId c, const std::string& piece) {
    for (char ch : piece) {
      c = store.step(c, static_cast<uint8_t>(ch));
      if (c == kDead) return kDead;
    }
    return c;
  }
};

TokenConstraint::TokenConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocabulary> vocab) {
  if (!grammar || !vocab) throw GrammarError("TokenConstraint needs a grammar and a vocabulary");
  auto tables = vocab->tables().get(grammar);
  state_ = std::make_unique<State>(std::move(vocab), std::move(tables));
}

TokenConstraint::~TokenConstraint() = default;
TokenConstraint::TokenConstraint(TokenConstraint&&) noexcept = default;
TokenConstraint& TokenConstraint::operator=(TokenConstraint&&) noexcept = default;

std::span<const uint64_t> TokenConstraint::allowed_bits() {
  State& s = *state_;
  if (s.ended) {
    s.ended_bits.assign(s.words, 0);
    s.set_eog(s.ended_bits);
    return s.ended_bits;
  }
  return s.bits_for(s.config);
}

void TokenConstraint::mask(std::span<float> logits) {
  State& s = *state_;
  const size_t n = s.vocab->size();
  if (logits.size() < n) {
    throw GrammarError("grammar mask: " + std::to_string(logits.size()) + " logits for a vocabulary of " +
                       std::to_string(n) + " tokens");
  }
  const std::span<const uint64_t> bits = allowed_bits();
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float* out = logits.data();
  const size_t full_words = n / 64;
  apply_mask(out, bits.data(), full_words);
  for (size_t t = full_words * 64; t < n; ++t) {
    if (((bits[t >> 6] >> (t & 63)) & 1) == 0) out[t] = kNegInf;
  }
  std::fill(out + n, out + logits.size(), kNegInf);
}

bool TokenConstraint::allows(int32_t token) {
  State& s = *state_;
  if (token < 0 || static_cast<size_t>(token) >= s.vocab->size()) return false;
  if (s.ended) return s.vocab->is_end_of_generation(token);
  if (s.vocab->is_end_of_generation(token)) return s.store.can_end(s.config);
  if (const auto* bits = s.cache.find(s.config)) return ((*bits)[static_cast<size_t>(token) >> 6] >> (token & 63)) & 1;
  const std::string& piece = s.vocab->piece(token);
  return !piece.empty() && s.advance(s.config, piece) != kDead;
}

void TokenConstraint::accept(int32_t token) {
  State& s = *state_;
  if (token < 0 || static_cast<size_t>(token) >= s.vocab->size()) {
    throw GrammarError("token " + std::to_string(token) + " is outside the vocabulary of " +
                       std::to_string(s.vocab->size()) + " tokens");
  }
  if (s.vocab->is_end_of_generation(token)) {
    if (!s.ended && !s.store.can_end(s.config)) {
      throw GrammarError("end of generation (token " + std::to_string(token) +
                         ") before the text matches the whole grammar");
    }
    s.ended = true;
    return;
  }
  const std::string& piece = s.vocab->piece(token);
  const ConfigId next = s.ended || piece.empty() ? kDead : s.advance(s.config, piece);
  if (next == kDead) throw GrammarError(describe_token(token, piece) + " is not allowed by the grammar here");
  s.config = next;
  if (s.store.config_count() > kCompactAfterConfigs) {
    s.config = s.store.compact(s.config);
    s.cache.clear();
  }
}

bool TokenConstraint::finished() const {
  const State& s = *state_;
  return s.ended || (s.store.can_end(s.config) && !s.store.has_stacks(s.config));
}

bool TokenConstraint::can_end() const {
  const State& s = *state_;
  return s.ended || s.store.can_end(s.config);
}

bool TokenConstraint::allows_any() {
  const auto bits = allowed_bits();
  return std::any_of(bits.begin(), bits.end(), [](uint64_t w) { return w != 0; });
}

}  // namespace m40::grammar
