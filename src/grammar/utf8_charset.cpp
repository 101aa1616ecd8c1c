#include "grammar/utf8_charset.h"

#include <algorithm>
#include <map>
#include <vector>

namespace m40::grammar::detail {

namespace {

using Ranges = std::vector<CodepointSet::Range>;

// The part of `set` inside [lo, hi].
Ranges clip(const Ranges& set, char32_t lo, char32_t hi) {
  Ranges out;
  auto it = std::lower_bound(set.begin(), set.end(), lo,
                             [](const CodepointSet::Range& r, char32_t v) { return r.second < v; });
  for (; it != set.end() && it->first <= hi; ++it) {
    out.push_back({std::max(it->first, lo), std::min(it->second, hi)});
  }
  return out;
}

class Builder {
 public:
  Builder(uint32_t to, const ByteGraphSink& sink) : to_(to), sink_(sink) {}

  // A state from which `k` continuation bytes spell the characters of `set`,
  // all inside the block [base, base + 64^k).
  uint32_t tail(const Ranges& set, uint32_t k, char32_t base) {
    if (k == 0) return to_;
    Ranges relative;
    for (const auto& r : set) relative.push_back({r.first - base, r.second - base});
    auto key = std::make_pair(k, relative);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    const uint32_t state = sink_.new_state();
    const char32_t block = char32_t{1} << (6 * (k - 1));
    emit_blocks(state, set, base, block, 0x80, 64, k - 1);
    memo_.emplace(std::move(key), state);
    return state;
  }

  // Edges from `state` on bytes first_byte + j for the `count` sub-blocks of
  // size `block` starting at `base`; runs of bytes with the same target merge.
  void emit_blocks(uint32_t state, const Ranges& set, char32_t base, char32_t block, uint32_t first_byte,
                   uint32_t count, uint32_t k) {
    uint32_t run_start = 0;
    uint32_t run_target = 0;
    bool in_run = false;
    for (uint32_t j = 0; j < count; ++j) {
      const char32_t lo = base + j * block;
      const Ranges sub = clip(set, lo, lo + block - 1);
      if (sub.empty()) {
        if (in_run) sink_.add_edge(state, static_cast<uint8_t>(first_byte + run_start), static_cast<uint8_t>(first_byte + j - 1), run_target);
        in_run = false;
        continue;
      }
      const uint32_t target = tail(sub, k, lo);
      if (in_run && target == run_target) continue;
      if (in_run) sink_.add_edge(state, static_cast<uint8_t>(first_byte + run_start), static_cast<uint8_t>(first_byte + j - 1), run_target);
      in_run = true;
      run_start = j;
      run_target = target;
    }
    if (in_run) sink_.add_edge(state, static_cast<uint8_t>(first_byte + run_start), static_cast<uint8_t>(first_byte + count - 1), run_target);
  }

 private:
  uint32_t to_;
  const ByteGraphSink& sink_;
  std::map<std::pair<uint32_t, Ranges>, uint32_t> memo_;
};

// The scalar values of `set` (surrogates removed).
Ranges scalar_values(const CodepointSet& set) {
  Ranges out;
  for (const auto& r : set.ranges()) {
    if (r.second < 0xD800 || r.first > 0xDFFF) {
      out.push_back(r);
      continue;
    }
    if (r.first < 0xD800) out.push_back({r.first, 0xD7FF});
    if (r.second > 0xDFFF) out.push_back({0xE000, r.second});
  }
  return out;
}

}  // namespace

void add_utf8_charset(const CodepointSet& set, uint32_t from, uint32_t to, const ByteGraphSink& sink) {
  const Ranges values = scalar_values(set);
  Builder builder(to, sink);
  // One byte: the byte is the character.
  for (const auto& r : clip(values, 0, 0x7F)) {
    sink.add_edge(from, static_cast<uint8_t>(r.first), static_cast<uint8_t>(r.second), to);
  }
  // Lead bytes C2..DF (2 bytes), E0..EF (3), F0..F4 (4): each lead byte
  // selects a block of 64^(n-1) code points, clipped to the characters that
  // really take n bytes (no overlong forms).
  struct Length {
    uint32_t lead_lo, lead_hi, continuation;
    char32_t lead_base, min, max;
  };
  static constexpr Length kLengths[] = {
      {0xC2, 0xDF, 1, 0xC0, 0x80, 0x7FF},
      {0xE0, 0xEF, 2, 0xE0, 0x800, 0xFFFF},
      {0xF0, 0xF4, 3, 0xF0, 0x10000, 0x10FFFF},
  };
  for (const Length& len : kLengths) {
    const Ranges in_length = clip(values, len.min, len.max);
    if (in_length.empty()) continue;
    const char32_t block = char32_t{1} << (6 * len.continuation);
    const char32_t base = (len.lead_lo - len.lead_base) * block;
    builder.emit_blocks(from, in_length, base, block, len.lead_lo, len.lead_hi - len.lead_lo + 1, len.continuation);
  }
}

uint32_t max_utf8_length(const CodepointSet& set) {
  if (set.empty()) return 0;
  const char32_t top = set.ranges().back().second;
  return top < 0x80 ? 1 : top < 0x800 ? 2 : top < 0x10000 ? 3 : 4;
}

}  // namespace m40::grammar::detail

