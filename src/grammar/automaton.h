// The compiled form of a grammar: one pushdown automaton over UTF-8 bytes.
//
// Every state belongs to a rule. From a state the automaton may consume a byte
// (ByteEdge), call a rule (CallEdge: push the return state, continue at the
// rule's start) or, when `final`, return from the current rule. Character
// classes are expanded into byte sequences, so a character split across two
// tokens is just a state between its bytes. Epsilon moves are removed at
// compile time; left recursion is refused, so following calls and returns
// (the closure) always terminates.
//
// Long bounded repetitions (`char{0,500}`) are not copied 500 times: they are
// counted loops. A stack frame inside one carries the number of iterations
// completed; the state ending an iteration (`loop_end`) goes back to the
// loop's start while the count allows and on to its exit. One loop at most is
// active per frame (a rule with more gets the others as separate rules).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace m40::grammar::detail {

struct ByteEdge {
  uint8_t lo;
  uint8_t hi;  // inclusive
  uint32_t target;
};

struct CallEdge {
  uint32_t rule;
  uint32_t return_state;
};

inline constexpr uint32_t kNoLoop = ~uint32_t{0};

struct AutomatonState {
  uint32_t edge_begin = 0;
  uint32_t edge_end = 0;
  uint32_t call_begin = 0;
  uint32_t call_end = 0;
  uint32_t loop = kNoLoop;      // the counted loop whose body this state is in
  uint32_t loop_end = kNoLoop;  // an iteration of this loop may end here
  bool final = false;
};

// A counted loop `item{0,max}`: iterations start at body_start; after the
// last one (or any, since the minimum is 0) the text continues at exit.
struct CountedLoop {
  uint32_t body_start;
  uint32_t exit;
  uint32_t max;
};

struct Automaton {
  std::vector<AutomatonState> states;
  std::vector<ByteEdge> edges;  // per state, sorted by `lo` (ranges of different targets may overlap)
  std::vector<CallEdge> calls;
  std::vector<CountedLoop> loops;
  std::vector<uint32_t> rule_start;        // per compiled rule
  std::vector<std::string> rule_names;     // per compiled rule
  std::vector<std::string> source_rules;   // the rule names of the source text
  uint32_t root_rule = 0;

  std::span<const ByteEdge> byte_edges(uint32_t s) const {
    const AutomatonState& st = states[s];
    return {edges.data() + st.edge_begin, edges.data() + st.edge_end};
  }
  std::span<const CallEdge> call_edges(uint32_t s) const {
    const AutomatonState& st = states[s];
    return {calls.data() + st.call_begin, calls.data() + st.call_end};
  }
  bool consumes(uint32_t s) const { return states[s].edge_end != states[s].edge_begin; }
  uint32_t root_start() const { return rule_start[root_rule]; }
};

}  // namespace m40::grammar::detail
