#include "grammar/grammar_compiler.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <string>
#include <unordered_map>

#include "grammar/grammar.h"
#include "grammar/utf8_charset.h"

namespace m40::grammar::detail {

namespace {

constexpr uint64_t kInfinite = UINT64_MAX;
// Build-time state budget: repetition copies its element, so `x{0,100000}` of
// a large x would otherwise exhaust memory.
constexpr size_t kMaxBuildStates = size_t{1} << 21;
// A non-recursive rule is inlined into its callers when its text is at most
// this long (then context-independent token checks see through it) ...
constexpr uint64_t kInlineMaxBytes = 64;
constexpr uint64_t kInlineMaxSize = 512;
// ... or when it is used once (nothing is duplicated), up to this size.
constexpr uint64_t kInlineSingleUseMaxSize = uint64_t{1} << 16;
constexpr int kMaxInlineDepth = 64;
// Bounded repetitions with more optional copies than this become counted
// loops (when the options allow): their states are shared by every count, so
// the token tables are computed once instead of once per copy.
constexpr uint32_t kCountedLoopMinOptional = 32;
// A counted loop that cannot have its frame's counter (another loop has it)
// is copied out when that stays this small, else made a rule of its own.
constexpr uint64_t kCopyInsteadOfLoopMaxSize = 4096;

uint64_t add_sat(uint64_t a, uint64_t b) { return a > kInfinite - b ? kInfinite : a + b; }
uint64_t mul_sat(uint64_t a, uint64_t b) {
  if (a == 0 || b == 0) return 0;
  return a > kInfinite / b ? kInfinite : a * b;
}

// How many copies of its element a repetition compiles to.
uint64_t repeat_copies(const Expr& e) {
  if (e.max == kUnbounded) return std::max<uint64_t>(e.min, 1);
  return e.max;
}

std::string location(const RuleDef& rule) {
  return "line " + std::to_string(rule.line) + ", column " + std::to_string(rule.column);
}

class Analysis {
 public:
  Analysis(const GbnfAst& ast, bool counted_loops) : ast_(ast), counted_loops_(counted_loops) {
    const size_t n = ast.rules.size();
    nullable_.assign(n, false);
    recursive_.assign(n, false);
    max_bytes_.assign(n, 0);
    size_.assign(n, 0);
    done_.assign(n, false);
    ref_count_.assign(n, 0);
    repeated_ref_.assign(n, false);
    inline_ok_.assign(n, false);
    has_loop_.assign(n, false);
    compute_nullable();
    check_left_recursion();
    compute_recursive();
    for (const RuleDef& rule : ast.rules) count_refs(rule.body, 1);
    for (uint32_t r = 0; r < n; ++r) has_loop_[r] = contains_counted_loop(ast.rules[r].body);
    for (uint32_t r = 0; r < n; ++r) measure_rule(r);
  }

  bool inline_ok(uint32_t rule) const { return inline_ok_[rule]; }

  // A repetition compiled as a counted loop.
  bool counted_loop(const Expr& e) const {
    return counted_loops_ && e.kind == Expr::Kind::kRepeat && e.max != kUnbounded &&
           e.max - e.min > kCountedLoopMinOptional && !nullable(e.children[0]);
  }

  // Compiled size of an expression (states, roughly).
  uint64_t size_of(const Expr& e) { return measure(e).second; }

  bool nullable(const Expr& e) const {
    switch (e.kind) {
      case Expr::Kind::kAlternation:
        return std::any_of(e.children.begin(), e.children.end(), [&](const Expr& c) { return nullable(c); });
      case Expr::Kind::kSequence:
        return std::all_of(e.children.begin(), e.children.end(), [&](const Expr& c) { return nullable(c); });
      case Expr::Kind::kChars: return false;
      case Expr::Kind::kRuleRef: return nullable_[e.rule];
      case Expr::Kind::kRepeat: return e.min == 0 || e.max == 0 || nullable(e.children[0]);
    }
    return false;
  }

 private:
  void compute_nullable() {
    for (bool changed = true; changed;) {
      changed = false;
      for (uint32_t r = 0; r < ast_.rules.size(); ++r) {
        if (!nullable_[r] && nullable(ast_.rules[r].body)) {
          nullable_[r] = true;
          changed = true;
        }
      }
    }
  }

  // Rules that can be entered before any character is consumed.
  void first_refs(const Expr& e, std::vector<uint32_t>& out) const {
    switch (e.kind) {
      case Expr::Kind::kAlternation:
        for (const Expr& c : e.children) first_refs(c, out);
        break;
      case Expr::Kind::kSequence:
        for (const Expr& c : e.children) {
          first_refs(c, out);
          if (!nullable(c)) break;
        }
        break;
      case Expr::Kind::kChars: break;
      case Expr::Kind::kRuleRef: out.push_back(e.rule); break;
      case Expr::Kind::kRepeat:
        if (e.max > 0) first_refs(e.children[0], out);
        break;
    }
  }

  void check_left_recursion() const {
    const size_t n = ast_.rules.size();
    std::vector<std::vector<uint32_t>> first(n);
    for (uint32_t r = 0; r < n; ++r) {
      first_refs(ast_.rules[r].body, first[r]);
      std::sort(first[r].begin(), first[r].end());
      first[r].erase(std::unique(first[r].begin(), first[r].end()), first[r].end());
    }
    std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
    std::vector<uint32_t> path;
    std::function<void(uint32_t)> visit = [&](uint32_t r) {
      color[r] = 1;
      path.push_back(r);
      for (uint32_t next : first[r]) {
        if (color[next] == 1) {
          auto from = std::find(path.begin(), path.end(), next);
          std::string cycle;
          for (auto it = from; it != path.end(); ++it) cycle += ast_.rules[*it].name + " -> ";
          cycle += ast_.rules[next].name;
          const RuleDef& rule = ast_.rules[next];
          throw GrammarError("GBNF " + location(rule) + ": rule '" + rule.name + "' is left-recursive (" + cycle +
                             " without consuming any text); move the recursion after some text or use * / +");
        }
        if (color[next] == 0) visit(next);
      }
      path.pop_back();
      color[r] = 2;
    };
    for (uint32_t r = 0; r < n; ++r) {
      if (color[r] == 0) visit(r);
    }
  }

  static void all_refs(const Expr& e, std::vector<uint32_t>& out) {
    if (e.kind == Expr::Kind::kRuleRef) out.push_back(e.rule);
    for (const Expr& c : e.children) all_refs(c, out);
  }

  // Rules on a cycle of references (Tarjan's strongly connected components).
  void compute_recursive() {
    const size_t n = ast_.rules.size();
    std::vector<std::vector<uint32_t>> refs(n);
    for (uint32_t r = 0; r < n; ++r) all_refs(ast_.rules[r].body, refs[r]);
    std::vector<int> index(n, -1), low(n, 0);
    std::vector<bool> on_stack(n, false);
    std::vector<uint32_t> stack;
    int counter = 0;
    std::function<void(uint32_t)> strong = [&](uint32_t v) {
      index[v] = low[v] = counter++;
      stack.push_back(v);
      on_stack[v] = true;
      for (uint32_t w : refs[v]) {
        if (w == v) recursive_[v] = true;
        if (index[w] < 0) {
          strong(w);
          low[v] = std::min(low[v], low[w]);
        } else if (on_stack[w]) {
          low[v] = std::min(low[v], index[w]);
        }
      }
      if (low[v] == index[v]) {
        std::vector<uint32_t> component;
        uint32_t w;
        do {
          w = stack.back();
          stack.pop_back();
          on_stack[w] = false;
          component.push_back(w);
        } while (w != v);
        if (component.size() > 1) {
          for (uint32_t c : component) recursive_[c] = true;
        }
      }
    };
    for (uint32_t r = 0; r < n; ++r) {
      if (index[r] < 0) strong(r);
    }
  }

  bool contains_counted_loop(const Expr& e) const {
    if (counted_loop(e)) return true;
    return std::any_of(e.children.begin(), e.children.end(), [&](const Expr& c) { return contains_counted_loop(c); });
  }

  void count_refs(const Expr& e, uint64_t copies) {
    if (e.kind == Expr::Kind::kRuleRef) {
      ++ref_count_[e.rule];
      if (copies > 1) repeated_ref_[e.rule] = true;
    }
    const uint64_t inner = e.kind == Expr::Kind::kRepeat ? mul_sat(copies, repeat_copies(e)) : copies;
    for (const Expr& c : e.children) count_refs(c, inner);
  }

  // Longest match in bytes and compiled size of an expression, given what is
  // known of the rules it references.
  std::pair<uint64_t, uint64_t> measure(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kChars: return {max_utf8_length(e.chars), 1};
      case Expr::Kind::kSequence:
      case Expr::Kind::kAlternation: {
        uint64_t bytes = 0, size = 1;
        for (const Expr& c : e.children) {
          auto [b, s] = measure(c);
          bytes = e.kind == Expr::Kind::kSequence ? add_sat(bytes, b) : std::max(bytes, b);
          size = add_sat(size, s);
        }
        return {bytes, size};
      }
      case Expr::Kind::kRuleRef: {
        if (recursive_[e.rule]) return {kInfinite, 1};
        measure_rule(e.rule);
        return {max_bytes_[e.rule], inline_ok_[e.rule] ? size_[e.rule] : 1};
      }
      case Expr::Kind::kRepeat: {
        auto [b, s] = measure(e.children[0]);
        const uint64_t bytes = e.max == kUnbounded ? (b == 0 ? 0 : kInfinite) : mul_sat(b, e.max);
        return {bytes, add_sat(1, mul_sat(s, repeat_copies(e)))};
      }
    }
    return {kInfinite, kInfinite};
  }

  void measure_rule(uint32_t r) {
    if (done_[r]) return;
    done_[r] = true;  // non-recursive rules only reach themselves through recursion, excluded above
    if (recursive_[r]) {
      max_bytes_[r] = kInfinite;
      size_[r] = 1;
      return;
    }
    auto [bytes, size] = measure(ast_.rules[r].body);
    max_bytes_[r] = bytes;
    size_[r] = size;
    const bool small = bytes <= kInlineMaxBytes && size <= kInlineMaxSize;
    const bool single_use = ref_count_[r] == 1 && !repeated_ref_[r] && size <= kInlineSingleUseMaxSize;
    // A rule with a counted loop keeps its own frame (and counter): inlined,
    // a second loop in the caller would have to become a rule cut at every
    // iteration.
    inline_ok_[r] = (small || single_use) && !has_loop_[r];
  }

  const GbnfAst& ast_;
  bool counted_loops_;
  std::vector<bool> nullable_, recursive_, done_, repeated_ref_, inline_ok_, has_loop_;
  std::vector<uint64_t> max_bytes_, size_;
  std::vector<uint32_t> ref_count_;
};

// One state of the automaton under construction (with epsilon moves).
struct BuildState {
  std::vector<uint32_t> eps;
  std::vector<ByteEdge> edges;
  std::vector<CallEdge> calls;
  uint32_t loop = kNoLoop;
  uint32_t loop_end = kNoLoop;
  bool final = false;
};

// A state after epsilon removal.
struct Row {
  std::vector<ByteEdge> edges;
  std::vector<CallEdge> calls;
  uint32_t loop = kNoLoop;
  uint32_t loop_end = kNoLoop;
  bool final = false;
};

void normalize_row(Row& row) {
  auto& e = row.edges;
  std::sort(e.begin(), e.end(), [](const ByteEdge& a, const ByteEdge& b) {
    return a.target != b.target ? a.target < b.target : a.lo < b.lo;
  });
  std::vector<ByteEdge> merged;
  for (const ByteEdge& edge : e) {
    if (!merged.empty() && merged.back().target == edge.target && edge.lo <= merged.back().hi + 1) {
      merged.back().hi = std::max(merged.back().hi, edge.hi);
    } else {
      merged.push_back(edge);
    }
  }
  std::sort(merged.begin(), merged.end(), [](const ByteEdge& a, const ByteEdge& b) {
    return a.lo != b.lo ? a.lo < b.lo : a.hi != b.hi ? a.hi < b.hi : a.target < b.target;
  });
  e = std::move(merged);
  std::sort(row.calls.begin(), row.calls.end(), [](const CallEdge& a, const CallEdge& b) {
    return a.rule != b.rule ? a.rule < b.rule : a.return_state < b.return_state;
  });
  row.calls.erase(std::unique(row.calls.begin(), row.calls.end(),
                              [](const CallEdge& a, const CallEdge& b) {
                                return a.rule == b.rule && a.return_state == b.return_state;
                              }),
                  row.calls.end());
}

class Compiler {
 public:
  Compiler(const GbnfAst& ast, uint32_t root, const CompileOptions& options)
      : ast_(ast), options_(options), analysis_(ast, options.counted_loops), compiled_(ast.rules.size(), -1) {
    root_compiled_ = compiled_rule(root);
  }

  std::shared_ptr<const Automaton> run() {
    while (!work_.empty()) {
      const Work w = work_.front();
      work_.pop_front();
      current_rule_ = w.rule;
      current_loop_ = kNoLoop;
      repeat_depth_ = 0;
      rule_has_loop_ = false;
      const uint32_t end = compile(*w.body, starts_[w.rule], 0);
      states_[end].final = true;
    }
    std::vector<Row> rows = remove_epsilons();
    prune(rows);
    merge_equivalent(rows);
    return finish(rows);
  }

 private:
  struct Work {
    uint32_t rule;  // compiled rule
    const Expr* body;
  };

  uint32_t new_state() {
    if (states_.size() >= kMaxBuildStates) {
      throw GrammarError("the grammar is too large to compile (over " + std::to_string(kMaxBuildStates) +
                         " states); reduce repetition counts such as {m,n}");
    }
    states_.emplace_back();
    states_.back().loop = current_loop_;
    return static_cast<uint32_t>(states_.size() - 1);
  }

  uint32_t add_rule(std::string name, const Expr* body) {
    const auto id = static_cast<uint32_t>(starts_.size());
    const uint32_t saved_loop = current_loop_;
    current_loop_ = kNoLoop;  // a rule's start is outside any loop
    starts_.push_back(new_state());
    current_loop_ = saved_loop;
    names_.push_back(std::move(name));
    work_.push_back({id, body});
    return id;
  }

  uint32_t compiled_rule(uint32_t r) {
    if (compiled_[r] < 0) compiled_[r] = static_cast<int32_t>(add_rule(ast_.rules[r].name, &ast_.rules[r].body));
    return static_cast<uint32_t>(compiled_[r]);
  }

  // Builds `e` starting at `from`; returns the state where it ends. Loops get
  // a fresh head state so no back edge re-enters a state shared with
  // something else.
  uint32_t compile(const Expr& e, uint32_t from, int depth) {
    switch (e.kind) {
      case Expr::Kind::kChars: {
        const uint32_t to = new_state();
        ByteGraphSink sink{[this] { return new_state(); },
                           [this](uint32_t a, uint8_t lo, uint8_t hi, uint32_t b) {
                             states_[a].edges.push_back({lo, hi, b});
                           }};
        add_utf8_charset(e.chars, from, to, sink);
        return to;
      }
      case Expr::Kind::kSequence: {
        uint32_t cur = from;
        for (const Expr& c : e.children) cur = compile(c, cur, depth);
        return cur;
      }
      case Expr::Kind::kAlternation: {
        const uint32_t to = new_state();
        for (const Expr& c : e.children) {
          const uint32_t end = compile(c, from, depth);
          states_[end].eps.push_back(to);
        }
        return to;
      }
      case Expr::Kind::kRuleRef: {
        if (analysis_.inline_ok(e.rule) && depth < kMaxInlineDepth) {
          // Inlined bodies start at a fresh state so their loops stay local.
          const uint32_t start = new_state();
          states_[from].eps.push_back(start);
          return compile(ast_.rules[e.rule].body, start, depth + 1);
        }
        const uint32_t to = new_state();
        const uint32_t rule = compiled_rule(e.rule);
        states_[from].calls.push_back({rule, to});
        return to;
      }
      case Expr::Kind::kRepeat: return compile_repeat(e, from, depth);
    }
    return from;
  }

  uint32_t compile_repeat(const Expr& e, uint32_t from, int depth) {
    const Expr& item = e.children[0];
    if (e.max == 0) return from;
    uint32_t cur = from;
    ++repeat_depth_;
    if (e.max == kUnbounded) {
      for (uint32_t i = 1; i < e.min; ++i) cur = compile(item, cur, depth);
      const uint32_t head = new_state();
      states_[cur].eps.push_back(head);
      const uint32_t body_end = compile(item, head, depth);
      const uint32_t exit = new_state();
      states_[body_end].eps.push_back(head);
      states_[e.min == 0 ? head : body_end].eps.push_back(exit);
      --repeat_depth_;
      return exit;
    }
    for (uint32_t i = 0; i < e.min; ++i) cur = compile(item, cur, depth);
    const uint32_t optional = e.max - e.min;
    const bool slot_free = repeat_depth_ == 1 && !rule_has_loop_ && current_loop_ == kNoLoop;
    if (analysis_.counted_loop(e) &&
        (slot_free || mul_sat(optional, analysis_.size_of(item)) > kCopyInsteadOfLoopMaxSize)) {
      --repeat_depth_;
      return counted_loop(item, optional, cur, depth);
    }
    const uint32_t exit = new_state();
    for (uint32_t i = e.min; i < e.max; ++i) {
      states_[cur].eps.push_back(exit);
      cur = compile(item, cur, depth);
    }
    states_[cur].eps.push_back(exit);
    --repeat_depth_;
    return exit;
  }

  // item{0,max} from `from`: inline when this frame has no other loop and no
  // repetition around it (one counter per frame, never re-entered), else as a
  // rule of its own.
  uint32_t counted_loop(const Expr& item, uint32_t max, uint32_t from, int depth) {
    if (repeat_depth_ > 0 || rule_has_loop_ || current_loop_ != kNoLoop) {
      Expr repeat;
      repeat.kind = Expr::Kind::kRepeat;
      repeat.min = 0;
      repeat.max = max;
      repeat.children.push_back(item);
      synthetic_.push_back(std::move(repeat));
      const uint32_t rule = add_rule(names_[current_rule_] + "{0," + std::to_string(max) + "}", &synthetic_.back());
      const uint32_t to = new_state();
      states_[from].calls.push_back({rule, to});
      return to;
    }
    rule_has_loop_ = true;
    const auto loop = static_cast<uint32_t>(loops_.size());
    loops_.push_back({0, 0, max});
    current_loop_ = loop;
    const uint32_t body_start = new_state();
    const uint32_t body_end = compile(item, body_start, depth);
    current_loop_ = kNoLoop;
    const uint32_t exit = new_state();
    states_[from].eps.push_back(body_start);
    states_[from].eps.push_back(exit);  // no iteration at all
    states_[body_end].loop_end = loop;
    loops_[loop].body_start = body_start;
    loops_[loop].exit = exit;
    return exit;
  }

  std::vector<Row> remove_epsilons() {
    const size_t n = states_.size();
    std::vector<bool> kept(n, false);
    for (uint32_t s : starts_) kept[s] = true;
    for (const CountedLoop& l : loops_) kept[l.body_start] = kept[l.exit] = true;
    for (const BuildState& st : states_) {
      for (const ByteEdge& e : st.edges) kept[e.target] = true;
      for (const CallEdge& c : st.calls) kept[c.return_state] = true;
    }
    std::vector<uint32_t> id(n, UINT32_MAX);
    uint32_t count = 0;
    for (size_t s = 0; s < n; ++s) {
      if (kept[s]) id[s] = count++;
    }
    std::vector<Row> rows(count);
    std::vector<uint32_t> seen(n, UINT32_MAX);
    std::vector<uint32_t> todo;
    for (size_t s = 0; s < n; ++s) {
      if (!kept[s]) continue;
      Row& row = rows[id[s]];
      row.loop = states_[s].loop;
      todo.assign(1, static_cast<uint32_t>(s));
      seen[s] = static_cast<uint32_t>(s);
      while (!todo.empty()) {
        const uint32_t t = todo.back();
        todo.pop_back();
        const BuildState& st = states_[t];
        row.final = row.final || st.final;
        if (st.loop_end != kNoLoop) row.loop_end = st.loop_end;  // at most one loop ends anywhere in a frame
        for (const ByteEdge& e : st.edges) row.edges.push_back({e.lo, e.hi, id[e.target]});
        for (const CallEdge& c : st.calls) row.calls.push_back({c.rule, id[c.return_state]});
        for (uint32_t next : st.eps) {
          if (seen[next] != s) {
            seen[next] = static_cast<uint32_t>(s);
            todo.push_back(next);
          }
        }
      }
      normalize_row(row);
    }
    for (uint32_t& s : starts_) s = id[s];
    for (CountedLoop& l : loops_) {
      l.body_start = id[l.body_start];
      l.exit = id[l.exit];
    }
    states_.clear();
    states_.shrink_to_fit();
    return rows;
  }

  // Drops what can never complete: edges into states from which no path
  // finishes the rule, and calls of rules that can never finish.
  void prune(std::vector<Row>& rows) {
    const size_t n = rows.size();
    std::vector<bool> productive(n, false);
    std::vector<bool> rule_productive(starts_.size(), false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t i = n; i-- > 0;) {
        if (productive[i]) continue;
        const Row& row = rows[i];
        bool p = row.final || (row.loop_end != kNoLoop && productive[loops_[row.loop_end].exit]);
        for (size_t k = 0; !p && k < row.edges.size(); ++k) p = productive[row.edges[k].target];
        for (size_t k = 0; !p && k < row.calls.size(); ++k) {
          p = rule_productive[row.calls[k].rule] && productive[row.calls[k].return_state];
        }
        if (p) {
          productive[i] = true;
          changed = true;
        }
      }
      for (size_t r = 0; r < starts_.size(); ++r) {
        if (!rule_productive[r] && productive[starts_[r]]) {
          rule_productive[r] = true;
          changed = true;
        }
      }
    }
    if (!rule_productive[root_compiled_]) {
      throw GrammarError("the grammar matches nothing: rule '" + names_[root_compiled_] +
                         "' can never be completed (check empty character classes and rules that only recurse)");
    }
    for (Row& row : rows) {
      std::erase_if(row.edges, [&](const ByteEdge& e) { return !productive[e.target]; });
      std::erase_if(row.calls, [&](const CallEdge& c) {
        return !rule_productive[c.rule] || !productive[c.return_state];
      });
    }
  }

  // Merges states whose rows are identical (after earlier merges), until none
  // are left: copies of a rule's tail that continue the same way become one.
  void merge_equivalent(std::vector<Row>& rows) {
    const size_t n = rows.size();
    std::vector<uint32_t> rep(n);
    for (uint32_t i = 0; i < n; ++i) rep[i] = i;
    auto find = [&](uint32_t s) {
      while (rep[s] != s) s = rep[s] = rep[rep[s]];
      return s;
    };
    auto append = [](std::string& key, uint32_t v) { key.append(reinterpret_cast<const char*>(&v), sizeof v); };
    for (bool changed = true; changed;) {
      changed = false;
      std::unordered_map<std::string, uint32_t> seen;
      std::string key;
      for (uint32_t i = 0; i < n; ++i) {
        if (find(i) != i) continue;
        Row& row = rows[i];
        for (ByteEdge& e : row.edges) e.target = find(e.target);
        for (CallEdge& c : row.calls) c.return_state = find(c.return_state);
        normalize_row(row);
        key.clear();
        key.push_back(row.final ? 'F' : 'N');
        append(key, row.loop);
        append(key, row.loop_end);
        for (const ByteEdge& e : row.edges) {
          key.push_back(static_cast<char>(e.lo));
          key.push_back(static_cast<char>(e.hi));
          append(key, e.target);
        }
        key.push_back('|');
        for (const CallEdge& c : row.calls) {
          append(key, c.rule);
          append(key, c.return_state);
        }
        auto [it, inserted] = seen.emplace(key, i);
        if (!inserted) {
          rep[i] = it->second;
          changed = true;
        }
      }
    }
    for (uint32_t i = 0; i < n; ++i) {
      for (ByteEdge& e : rows[i].edges) e.target = find(e.target);
      for (CallEdge& c : rows[i].calls) c.return_state = find(c.return_state);
    }
    for (uint32_t& s : starts_) s = find(s);
    for (CountedLoop& l : loops_) {
      l.body_start = find(l.body_start);
      l.exit = find(l.exit);
    }
  }

  // Numbers the reachable states from the root (breadth first) and packs them.
  std::shared_ptr<const Automaton> finish(std::vector<Row>& rows) {
    const size_t n = rows.size();
    std::vector<uint32_t> id(n, UINT32_MAX);
    std::vector<uint32_t> order;
    std::vector<bool> rule_used(starts_.size(), false);
    auto reach = [&](uint32_t s) {
      if (id[s] == UINT32_MAX) {
        id[s] = static_cast<uint32_t>(order.size());
        order.push_back(s);
      }
    };
    reach(starts_[root_compiled_]);
    rule_used[root_compiled_] = true;
    for (size_t i = 0; i < order.size(); ++i) {
      const Row& row = rows[order[i]];
      for (const ByteEdge& e : row.edges) reach(e.target);
      for (const CallEdge& c : row.calls) {
        if (!rule_used[c.rule]) {
          rule_used[c.rule] = true;
          reach(starts_[c.rule]);
        }
        reach(c.return_state);
      }
      if (row.loop_end != kNoLoop) {
        reach(loops_[row.loop_end].body_start);
        reach(loops_[row.loop_end].exit);
      }
    }
    // Keep rule numbers dense over the rules still called.
    std::vector<uint32_t> rule_id(starts_.size(), UINT32_MAX);
    auto automaton = std::make_shared<Automaton>();
    for (size_t r = 0; r < starts_.size(); ++r) {
      if (!rule_used[r]) continue;
      rule_id[r] = static_cast<uint32_t>(automaton->rule_start.size());
      automaton->rule_start.push_back(id[starts_[r]]);
      automaton->rule_names.push_back(names_[r]);
    }
    automaton->root_rule = rule_id[root_compiled_];
    for (const CountedLoop& l : loops_) {
      // Loops cut away as unreachable keep their number, unused.
      automaton->loops.push_back({id[l.body_start], id[l.exit], l.max});
    }
    automaton->states.resize(order.size());
    for (size_t i = 0; i < order.size(); ++i) {
      Row& row = rows[order[i]];
      for (ByteEdge& e : row.edges) e.target = id[e.target];
      for (CallEdge& c : row.calls) {
        c.rule = rule_id[c.rule];
        c.return_state = id[c.return_state];
      }
      normalize_row(row);
      AutomatonState& st = automaton->states[i];
      st.final = row.final;
      st.loop = row.loop;
      st.loop_end = row.loop_end;
      st.edge_begin = static_cast<uint32_t>(automaton->edges.size());
      automaton->edges.insert(automaton->edges.end(), row.edges.begin(), row.edges.end());
      st.edge_end = static_cast<uint32_t>(automaton->edges.size());
      st.call_begin = static_cast<uint32_t>(automaton->calls.size());
      automaton->calls.insert(automaton->calls.end(), row.calls.begin(), row.calls.end());
      st.call_end = static_cast<uint32_t>(automaton->calls.size());
    }
    for (const RuleDef& rule : ast_.rules) automaton->source_rules.push_back(rule.name);
    return automaton;
  }

  const GbnfAst& ast_;
  CompileOptions options_;
  Analysis analysis_;
  std::vector<int32_t> compiled_;  // source rule -> compiled rule
  std::vector<uint32_t> starts_;   // compiled rule -> start state
  std::vector<std::string> names_;
  std::deque<Work> work_;
  std::deque<Expr> synthetic_;     // bodies of rules made for counted loops
  std::vector<BuildState> states_;
  std::vector<CountedLoop> loops_;
  uint32_t root_compiled_ = 0;
  // The rule being compiled.
  uint32_t current_rule_ = 0;
  uint32_t current_loop_ = kNoLoop;
  int repeat_depth_ = 0;
  bool rule_has_loop_ = false;
};

}  // namespace

std::shared_ptr<const Automaton> compile_grammar(const GbnfAst& ast, std::string_view root,
                                                 const CompileOptions& options) {
  uint32_t root_rule = UINT32_MAX;
  for (uint32_t r = 0; r < ast.rules.size(); ++r) {
    if (ast.rules[r].name == root) root_rule = r;
  }
  if (root_rule == UINT32_MAX) {
    throw GrammarError("the grammar has no rule '" + std::string(root) + "' to start from; define `" +
                       std::string(root) + " ::= ...`");
  }
  return Compiler(ast, root_rule, options).run();
}

}  // namespace m40::grammar::detail
