#include "grammar/stack_store.h"

#include <algorithm>

namespace m40::grammar::detail {

namespace {

uint64_t hash_config(const std::vector<NodeId>& nodes, const std::vector<uint32_t>& escapes, uint8_t flags) {
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ flags;
  for (NodeId n : nodes) h ^= n + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
  for (uint32_t e : escapes) h ^= (e + 0x51ED27ULL) * 0xC2B2AE3D27D4EB4FULL + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdULL;
}

}  // namespace

StackStore::StackStore(std::shared_ptr<const Automaton> automaton) : automaton_(std::move(automaton)) { reset(); }

void StackStore::reset() {
  const auto states = static_cast<uint32_t>(automaton_->states.size());
  frame_state_.resize(states);
  for (uint32_t s = 0; s < states; ++s) frame_state_[s] = s;
  frame_count_.assign(states, 0);
  frame_index_ = FlatMap64();
  node_frame_.assign({0, 0});  // kBottom, kCeiling (their frames are never read)
  node_parent_.assign({0, 0});
  node_index_ = FlatMap64();
  pool_.clear();
  esc_pool_.clear();
  configs_.clear();
  config_table_.assign(1024, 0);
  rows_.clear();
  deltas_.clear();
  return_memo_ = FlatMap64();
  // kDead: no stacks, no flags.
  scratch_nodes_.clear();
  scratch_escapes_.clear();
  scratch_flags_ = 0;
  intern_scratch();
}

size_t StackStore::memory_bytes() const {
  size_t rows = 0;
  for (const auto& r : rows_) rows += r ? 256 * sizeof(uint32_t) : 0;
  for (const auto& d : deltas_) rows += d ? 256 : 0;
  return frame_state_.capacity() * 8 + frame_index_.memory_bytes() + node_frame_.capacity() * 8 +
         node_index_.memory_bytes() + pool_.capacity() * 4 + esc_pool_.capacity() * 4 +
         configs_.capacity() * sizeof(ConfigRecord) + config_table_.capacity() * 4 + rows_.capacity() * 8 + rows +
         return_memo_.memory_bytes();
}

uint32_t StackStore::frame(uint32_t state, uint32_t count) {
  if (count == 0) return state;
  const uint64_t key = (uint64_t{state} << 32) | count;
  auto [id, inserted] = frame_index_.insert(key, static_cast<uint32_t>(frame_state_.size()));
  if (inserted) {
    frame_state_.push_back(state);
    frame_count_.push_back(count);
  }
  return id;
}

NodeId StackStore::node(uint32_t frame_id, NodeId parent) {
  const uint64_t key = (uint64_t{frame_id} << 32) | parent;
  auto [id, inserted] = node_index_.insert(key, static_cast<uint32_t>(node_frame_.size()));
  if (inserted) {
    node_frame_.push_back(frame_id);
    node_parent_.push_back(parent);
  }
  return id;
}

void StackStore::close(uint32_t start_frame, NodeId start_parent) {
  const Automaton& a = *automaton_;
  work_.clear();
  work_.push_back({start_frame, start_parent});
  while (!work_.empty()) {
    auto [f, p] = work_.back();
    work_.pop_back();
    if (!visited_.insert((uint64_t{f} << 32) | p, 0).second) continue;
    const uint32_t q = frame_state_[f];
    const uint32_t c = frame_count_[f];
    const AutomatonState& st = a.states[q];
    if (st.edge_end != st.edge_begin) scratch_nodes_.push_back(node(f, p));
    for (uint32_t k = st.call_begin; k < st.call_end; ++k) {
      const CallEdge& call = a.calls[k];
      work_.push_back({a.rule_start[call.rule], node(frame(call.return_state, c), p)});
    }
    if (st.loop_end != kNoLoop) {
      const CountedLoop& loop = a.loops[st.loop_end];
      if ((c & kRelativeCount) != 0) {
        // The walk's own loop: the count before it is unknown, so both ways
        // stay open and the count says what the path needs.
        const uint32_t done = (c & kCountMask) + 1;
        work_.push_back({frame(loop.body_start, kRelativeCount | done), p});
        work_.push_back({frame(loop.exit, kExitedCount | done), p});
      } else {
        const uint32_t done = c + 1;
        if (done < loop.max) work_.push_back({frame(loop.body_start, done), p});
        work_.push_back({loop.exit, p});
      }
    }
    if (st.final) {
      if (p == kBottom) {
        scratch_flags_ |= kCanEnd;
      } else if (p == kCeiling) {
        scratch_escapes_.push_back((c & kExitedCount) != 0 ? (c & kCountMask) : 0);
      } else {
        work_.push_back({node_frame_[p], node_parent_[p]});
      }
    }
  }
}

ConfigId StackStore::intern_scratch() {
  std::sort(scratch_nodes_.begin(), scratch_nodes_.end());
  scratch_nodes_.erase(std::unique(scratch_nodes_.begin(), scratch_nodes_.end()), scratch_nodes_.end());
  std::sort(scratch_escapes_.begin(), scratch_escapes_.end());
  scratch_escapes_.erase(std::unique(scratch_escapes_.begin(), scratch_escapes_.end()), scratch_escapes_.end());
  const uint64_t h = hash_config(scratch_nodes_, scratch_escapes_, scratch_flags_);
  size_t mask = config_table_.size() - 1;
  size_t i = static_cast<size_t>(h) & mask;
  for (; config_table_[i] != 0; i = (i + 1) & mask) {
    const ConfigRecord& c = configs_[config_table_[i] - 1];
    if (c.hash == h && c.flags == scratch_flags_ && c.end - c.begin == scratch_nodes_.size() &&
        c.esc_end - c.esc_begin == scratch_escapes_.size() &&
        std::equal(scratch_nodes_.begin(), scratch_nodes_.end(), pool_.begin() + c.begin) &&
        std::equal(scratch_escapes_.begin(), scratch_escapes_.end(), esc_pool_.begin() + c.esc_begin)) {
      return config_table_[i] - 1;
    }
  }
  const auto id = static_cast<ConfigId>(configs_.size());
  ConfigRecord rec;
  rec.begin = static_cast<uint32_t>(pool_.size());
  pool_.insert(pool_.end(), scratch_nodes_.begin(), scratch_nodes_.end());
  rec.end = static_cast<uint32_t>(pool_.size());
  rec.esc_begin = static_cast<uint32_t>(esc_pool_.size());
  esc_pool_.insert(esc_pool_.end(), scratch_escapes_.begin(), scratch_escapes_.end());
  rec.esc_end = static_cast<uint32_t>(esc_pool_.size());
  rec.flags = scratch_flags_;
  rec.hash = h;
  configs_.push_back(rec);
  rows_.emplace_back();
  deltas_.emplace_back();
  config_table_[i] = id + 1;
  if (configs_.size() * 2 > config_table_.size()) {
    std::vector<uint32_t> table(config_table_.size() * 2, 0);
    mask = table.size() - 1;
    for (uint32_t c = 0; c < configs_.size(); ++c) {
      size_t j = static_cast<size_t>(configs_[c].hash) & mask;
      while (table[j] != 0) j = (j + 1) & mask;
      table[j] = c + 1;
    }
    config_table_ = std::move(table);
  }
  return id;
}

void StackStore::begin_scratch() {
  scratch_nodes_.clear();
  scratch_escapes_.clear();
  scratch_flags_ = 0;
  visited_.clear();
}

ConfigId StackStore::initial() {
  begin_scratch();
  close(automaton_->root_start(), kBottom);
  return intern_scratch();
}

ConfigId StackStore::isolated(uint32_t state) {
  has_isolated_ = true;
  begin_scratch();
  const bool in_loop = automaton_->states[state].loop != kNoLoop;
  scratch_nodes_.push_back(node(frame(state, in_loop ? kRelativeCount : 0), kCeiling));
  return intern_scratch();
}

ConfigId StackStore::after_return(NodeId parent) {
  if (const uint32_t* found = return_memo_.find(parent)) return *found;
  begin_scratch();
  if (parent == kBottom) {
    scratch_flags_ = kCanEnd;
  } else if (parent == kCeiling) {
    scratch_escapes_.push_back(0);
  } else {
    close(node_frame_[parent], node_parent_[parent]);
  }
  const ConfigId id = intern_scratch();
  return_memo_.insert(parent, id);
  return id;
}

ConfigId StackStore::compute_step(ConfigId config, uint8_t byte) {
  const Automaton& a = *automaton_;
  begin_scratch();
  const ConfigRecord rec = configs_[config];
  for (uint32_t k = rec.begin; k < rec.end; ++k) {
    const NodeId n = pool_[k];
    const uint32_t f = node_frame_[n];
    const uint32_t c = frame_count_[f];
    const AutomatonState& st = a.states[frame_state_[f]];
    for (uint32_t e = st.edge_begin; e < st.edge_end; ++e) {
      const ByteEdge& edge = a.edges[e];
      if (edge.lo > byte) break;
      if (edge.hi >= byte) close(frame(edge.target, c), node_parent_[n]);
    }
  }
  const uint32_t subtracted = normalize_scratch();
  const ConfigId next = intern_scratch();
  auto& row = rows_[config];
  if (!row) {
    row = std::make_unique<uint32_t[]>(256);
    std::fill_n(row.get(), 256, kUnknown);
  }
  row[byte] = next;
  if (subtracted > 0) {
    auto& delta = deltas_[config];
    if (!delta) delta = std::make_unique<uint8_t[]>(256);  // zeroed
    delta[byte] = static_cast<uint8_t>(std::min<uint32_t>(subtracted, 255));
  }
  return next;
}

uint32_t StackStore::normalize_scratch() {
  if (!has_isolated_) return 0;  // no relative counts in stores of whole texts
  uint32_t least = ~uint32_t{0};
  auto relative = [](uint32_t c) { return (c & (kRelativeCount | kExitedCount)) != 0; };
  auto bottom_of = [&](NodeId n) {
    while (node_parent_[n] != kCeiling && node_parent_[n] != kBottom) n = node_parent_[n];
    return n;
  };
  for (NodeId n : scratch_nodes_) {
    const NodeId b = bottom_of(n);
    if (node_parent_[b] != kCeiling) return 0;  // an absolute walk
    const uint32_t c = frame_count_[node_frame_[b]];
    if (relative(c)) least = std::min(least, c & kCountMask);
  }
  for (uint32_t e : scratch_escapes_) least = std::min(least, e);
  if (least == 0 || least == ~uint32_t{0}) return 0;
  least = std::min<uint32_t>(least, 255);
  // Rebuild each stack with its bottom frame's count lowered.
  std::vector<uint32_t> chain;
  for (NodeId& n : scratch_nodes_) {
    chain.clear();
    NodeId m = n;
    for (; node_parent_[m] != kCeiling; m = node_parent_[m]) chain.push_back(node_frame_[m]);
    const uint32_t c = frame_count_[node_frame_[m]];
    if (!relative(c)) continue;
    NodeId below = node(frame(frame_state_[node_frame_[m]], (c & ~kCountMask) | ((c & kCountMask) - least)), kCeiling);
    for (size_t k = chain.size(); k-- > 0;) below = node(chain[k], below);
    n = below;
  }
  for (uint32_t& e : scratch_escapes_) e -= least;
  return least;
}

ConfigId StackStore::compact(ConfigId config) {
  // Each stack as its frames (state, count) from top to bottom and what it
  // rests on, then interned again in a fresh store.
  struct Frame {
    uint32_t state, count;
  };
  std::vector<std::vector<Frame>> chains;
  std::vector<NodeId> bottoms;
  for (NodeId n : stacks(config)) {
    std::vector<Frame> chain;
    NodeId m = n;
    for (; m != kBottom && m != kCeiling; m = node_parent_[m]) {
      chain.push_back({frame_state_[node_frame_[m]], frame_count_[node_frame_[m]]});
    }
    chains.push_back(std::move(chain));
    bottoms.push_back(m);
  }
  const std::vector<uint32_t> escapes(escape_needs(config).begin(), escape_needs(config).end());
  const uint8_t flags = configs_[config].flags;
  reset();
  begin_scratch();
  for (size_t i = 0; i < chains.size(); ++i) {
    NodeId below = bottoms[i];
    for (size_t k = chains[i].size(); k-- > 0;) below = node(frame(chains[i][k].state, chains[i][k].count), below);
    scratch_nodes_.push_back(below);
  }
  scratch_escapes_ = escapes;
  scratch_flags_ = flags;
  return intern_scratch();
}

}  // namespace m40::grammar::detail
