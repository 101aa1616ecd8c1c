// The pushdown runtime's state, interned: a stack is a node (frame, parent
// node), shared by every stack with the same tail, where a frame is an
// automaton state and, inside a counted loop, the iterations completed; a
// configuration is
// the sorted set of stacks the text so far can be in (all of them at states
// that consume bytes) plus whether the text is complete. Configurations are
// numbered, and the step from a configuration by a byte is computed once and
// then looked up, so a matcher walking text or a token trie mostly reads
// tables.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/flat_map.h"

namespace m40::grammar::detail {

using NodeId = uint32_t;
using ConfigId = uint32_t;

// Below the root rule: returning into it completes the grammar.
inline constexpr NodeId kBottom = 0;
// Below a state examined on its own (TokenTables): returning into it means the
// rest depends on the stack below, which is not known there.
inline constexpr NodeId kCeiling = 1;
// No stack and not complete: nothing can follow.
inline constexpr ConfigId kDead = 0;

// Iteration counts of the frame a table walk starts in (over kCeiling) are
// relative: that frame's count before the walk is not known, so its loop
// always continues and always exits, and the walk records how many
// iterations the token needed (CountedLoop semantics, see automaton.h).
inline constexpr uint32_t kRelativeCount = 1u << 30;  // still in the loop, count since the walk began
inline constexpr uint32_t kExitedCount = 1u << 29;    // left the loop after that many iterations
inline constexpr uint32_t kCountMask = kExitedCount - 1;

class StackStore {
 public:
  explicit StackStore(std::shared_ptr<const Automaton> automaton);

  const Automaton& automaton() const { return *automaton_; }

  // The root rule not yet begun.
  ConfigId initial();
  // A single stack at `state` over kCeiling, without following its calls or
  // return (the state must consume bytes); inside a counted loop its count
  // is relative.
  ConfigId isolated(uint32_t state);
  // The configuration after consuming `byte`.
  ConfigId step(ConfigId config, uint8_t byte) {
    const uint32_t* row = rows_[config].get();
    if (row != nullptr && row[byte] != kUnknown) return row[byte];
    return compute_step(config, byte);
  }
  // The same, for walks with relative counts: configurations are kept with
  // the smallest relative count subtracted (so the walk's configurations do
  // not multiply with the token's length), and `added` grows by what was
  // subtracted on this step.
  ConfigId step(ConfigId config, uint8_t byte, uint32_t& added) {
    const ConfigId next = step(config, byte);
    const uint8_t* delta = deltas_[config].get();
    if (delta != nullptr) added += delta[byte];
    return next;
  }
  // Where the text continues once the rule on top of a stack returns into
  // node `parent` (its caller's return state and what lies below).
  ConfigId after_return(NodeId parent);

  std::span<const NodeId> stacks(ConfigId config) const {
    const ConfigRecord& c = configs_[config];
    return {pool_.data() + c.begin, pool_.data() + c.end};
  }
  // A path has returned from the root rule: the text so far is a complete match.
  bool can_end(ConfigId config) const { return (configs_[config].flags & kCanEnd) != 0; }
  // Paths have returned past kCeiling: the iterations each needed of the
  // walk's relative loop (0 without one), ascending.
  bool escaped(ConfigId config) const { return configs_[config].esc_end != configs_[config].esc_begin; }
  std::span<const uint32_t> escape_needs(ConfigId config) const {
    const ConfigRecord& c = configs_[config];
    return {esc_pool_.data() + c.esc_begin, esc_pool_.data() + c.esc_end};
  }
  bool has_stacks(ConfigId config) const { return configs_[config].end != configs_[config].begin; }

  uint32_t state(NodeId node) const { return frame_state_[node_frame_[node]]; }
  // Iterations completed in the node's counted loop (0 outside one).
  uint32_t count(NodeId node) const { return frame_count_[node_frame_[node]]; }
  NodeId parent(NodeId node) const { return node_parent_[node]; }

  size_t config_count() const { return configs_.size(); }
  size_t memory_bytes() const;

  // Forgets everything but `config`, which is returned under its new number
  // (other numbers become invalid). Keeps memory bounded on long texts.
  ConfigId compact(ConfigId config);

 private:
  static constexpr uint32_t kUnknown = ~uint32_t{0};
  static constexpr uint8_t kCanEnd = 1;

  struct ConfigRecord {
    uint32_t begin;
    uint32_t end;
    uint32_t esc_begin;
    uint32_t esc_end;
    uint8_t flags;
    uint64_t hash;
  };

  void reset();
  void begin_scratch();
  uint32_t frame(uint32_t state, uint32_t count);
  NodeId node(uint32_t frame, NodeId parent);
  // Adds to the scratch set every stack reachable from (frame, parent) by
  // calls, returns and loop iterations.
  void close(uint32_t frame, NodeId parent);
  ConfigId intern_scratch();
  ConfigId compute_step(ConfigId config, uint8_t byte);
  // Subtracts the smallest relative count from the scratch configuration's
  // relative counts; returns it.
  uint32_t normalize_scratch();

  std::shared_ptr<const Automaton> automaton_;
  // Frames: number s < state count is (s, 0); others are interned.
  std::vector<uint32_t> frame_state_;
  std::vector<uint32_t> frame_count_;
  FlatMap64 frame_index_;
  std::vector<uint32_t> node_frame_;
  std::vector<NodeId> node_parent_;
  FlatMap64 node_index_;
  std::vector<NodeId> pool_;
  std::vector<uint32_t> esc_pool_;
  std::vector<ConfigRecord> configs_;
  std::vector<uint32_t> config_table_;  // open addressing: config number + 1, 0 empty
  std::vector<std::unique_ptr<uint32_t[]>> rows_;
  std::vector<std::unique_ptr<uint8_t[]>> deltas_;  // only where a step subtracted something
  FlatMap64 return_memo_;
  bool has_isolated_ = false;  // isolated() was used: stacks over kCeiling exist

  // Scratch for one step.
  std::vector<NodeId> scratch_nodes_;
  std::vector<uint32_t> scratch_escapes_;
  uint8_t scratch_flags_ = 0;
  FlatMap64 visited_;
  std::vector<std::pair<uint32_t, NodeId>> work_;
};

}  // namespace m40::grammar::detail
