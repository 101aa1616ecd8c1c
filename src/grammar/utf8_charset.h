// A set of code points as byte transitions: the UTF-8 encodings of exactly
// the set's characters (no surrogates, no overlong forms), deterministic
// (from any state, each byte leads to at most one state).
#pragma once

#include <cstdint>
#include <functional>

#include "grammar/gbnf_ast.h"

namespace m40::grammar::detail {

struct ByteGraphSink {
  std::function<uint32_t()> new_state;
  std::function<void(uint32_t from, uint8_t lo, uint8_t hi, uint32_t to)> add_edge;
};

// Adds states and edges so that the paths from `from` to `to` spell the UTF-8
// encodings of the characters of `set`.
void add_utf8_charset(const CodepointSet& set, uint32_t from, uint32_t to, const ByteGraphSink& sink);

// Longest UTF-8 encoding of a character of the set (0 for the empty set).
uint32_t max_utf8_length(const CodepointSet& set);

}  // namespace m40::grammar::detail
