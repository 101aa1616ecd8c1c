// Renders a parsed Template: a tree-walking interpreter with Jinja2's
// scoping (a for-loop iteration, a macro call, a with block and a block set
// each get their own scope; if does not), Python semantics for every value
// operation, and hard bounds on output size, work and recursion.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chat/jinja/ast.h"
#include "chat/jinja/render_limits.h"
#include "chat/jinja/value.h"

namespace m40::chat::jinja {

using Limits = RenderLimits;

struct Scope {
  Scope* parent = nullptr;
  std::vector<std::pair<std::string, Value>> vars;
  bool captured = false;  // a macro or caller refers to it: keep it alive

  const Value* find(const std::string& name) const {
    for (const auto& v : vars)
      if (v.first == name) return &v.second;
    return nullptr;
  }
  void set(const std::string& name, Value value) {
    for (auto& v : vars) {
      if (v.first == name) {
        v.second = std::move(value);
        return;
      }
    }
    vars.emplace_back(name, std::move(value));
  }
};

class Interpreter {
 public:
  // `variables` are the render variables (messages, bos_token, ...,
  // raise_exception, strftime_now); Jinja's own globals (range, dict,
  // namespace, cycler, joiner) stand behind them.
  Interpreter(const Template& tpl, const Dict& variables, const Limits& limits);
  ~Interpreter();

  // Throws TemplateRenderError (or a subclass) on failure.
  std::string render();

  // For builtins: calling values, accounting for work and size.
  Value call(const Value& callee, CallArgs& args);
  void step();
  // A string the template builds may not exceed max_output_bytes.
  void check_size(size_t bytes) const;
  // Counts memory the render builds against max_built_bytes.
  void account(size_t bytes);
  // Keeps a mutable object's values until the render ends (then releases
  // them, breaking any reference cycle through it).
  void adopt(std::shared_ptr<Object> object) { objects_.push_back(std::move(object)); }
  // Python iteration, accounted (a long string becomes one Value per character).
  std::vector<Value> iterate(const Value& v);
  int current_line() const { return current_line_; }
  const Limits& limits() const { return limits_; }

 private:
  enum class Flow { Normal, Break, Continue };
  friend class MacroCall;
  friend class LoopObject;

  Flow exec_body(const Body& body, Scope* scope);
  Flow exec(const Stmt& s, Scope* scope);
  void exec_for(const ForStmt& s, Scope* scope);
  std::string run_loop(const ForStmt& s, const Value& iterable, Scope* scope, int depth, bool capture);
  void exec_call_block(const CallBlockStmt& s, Scope* scope);
  Value make_macro(const std::string& name, const MacroSignature* signature, const Body* body, Scope* scope);
  Value call_macro(const std::string& name, const MacroSignature& signature, const Body& body, Scope* scope,
                   CallArgs& args);

  Value eval(const Expr& e, Scope* scope);
  Value eval_inner(const Expr& e, Scope* scope);
  Value lookup(const std::string& name, Scope* scope) const;
  CallArgs eval_args(const CallArguments& a, Scope* scope);
  Value eval_getitem(const GetitemExpr& e, Scope* scope);
  Value eval_compare(const CompareExpr& e, Scope* scope);
  Value apply_filter_chain(const Expr& chain, Value input, Scope* scope);
  void assign(const Target& target, const Value& value, Scope* scope);

  void write(const std::string& text);
  std::string capture(const Body& body, Scope* scope);

  Scope* new_scope(Scope* parent);
  void release_scope(Scope* scope);
  static void mark_captured(Scope* scope);

  struct Nesting;

  const Template& template_;
  Limits limits_;
  std::vector<std::unique_ptr<Scope>> scopes_;
  std::vector<Scope*> free_scopes_;
  std::vector<std::shared_ptr<Object>> objects_;
  Scope* globals_ = nullptr;
  Scope* context_ = nullptr;
  std::string* out_ = nullptr;
  uint64_t steps_ = 0;
  size_t built_bytes_ = 0;
  int call_depth_ = 0;
  int nesting_ = 0;
  int current_line_ = 1;
};

}  // namespace m40::chat::jinja
