#include "chat/jinja/interpreter.h"

#include <utility>

#include "chat/jinja/builtins.h"
#include "chat/jinja/python.h"
#include "chat/jinja/template_error.h"

namespace m40::chat::jinja {

namespace {

// The loop variable of a for loop: one object per loop, advanced per
// iteration (as Jinja2's LoopContext is).
class LoopState : public Object {
 public:
  LoopState(std::vector<Value> items, int depth) : items_(std::move(items)), depth_(depth) {}

  std::string type_name() const override { return "LoopContext"; }
  std::string repr() const override {
    return "<LoopContext " + std::to_string(index_ + 1) + "/" + std::to_string(items_.size()) + ">";
  }

  Value get_attr(const std::string& name) const override {
    const auto n = static_cast<int64_t>(items_.size());
    const auto i = static_cast<int64_t>(index_);
    if (name == "index") return Value(i + 1);
    if (name == "index0") return Value(i);
    if (name == "revindex") return Value(n - i);
    if (name == "revindex0") return Value(n - i - 1);
    if (name == "first") return Value(i == 0);
    if (name == "last") return Value(i == n - 1);
    if (name == "length") return Value(n);
    if (name == "depth") return Value(static_cast<int64_t>(depth_) + 1);
    if (name == "depth0") return Value(static_cast<int64_t>(depth_));
    if (name == "previtem") {
      return i > 0 ? items_[index_ - 1] : Value::undefined("there is no previous item");
    }
    if (name == "nextitem") {
      return i + 1 < n ? items_[index_ + 1] : Value::undefined("there is no next item");
    }
    if (name == "cycle") {
      const size_t index = index_;
      return Value::function("cycle", [index](Interpreter&, CallArgs& args) -> Value {
        if (args.positional.empty()) throw Failure("no items for cycling given");
        return args.positional[index % args.positional.size()];
      });
    }
    if (name == "changed") {
      auto self = std::static_pointer_cast<LoopState>(self_.lock());
      return Value::function("changed", [self](Interpreter&, CallArgs& args) -> Value {
        Value current = Value::list(args.positional);
        if (self->has_last_changed_ && equal(self->last_changed_, current)) return Value(false);
        self->last_changed_ = std::move(current);
        self->has_last_changed_ = true;
        return Value(true);
      });
    }
    return Value::undefined("'LoopContext object' has no attribute '" + name + "'");
  }

  bool is_callable() const override { return static_cast<bool>(recurse_); }
  void release() override {
    items_.clear();
    last_changed_ = Value();
    recurse_ = nullptr;
  }
  Value call(Interpreter& in, CallArgs& args) override {
    if (!recurse_) {
      throw Failure("Tried to call non recursive loop.  Maybe you forgot the 'recursive' modifier.");
    }
    if (args.positional.size() != 1 || !args.keyword.empty()) throw Failure("loop() takes exactly one argument");
    return recurse_(in, args.positional[0]);
  }

  const std::vector<Value>& items() const { return items_; }
  size_t index_ = 0;
  std::weak_ptr<Object> self_;
  std::function<Value(Interpreter&, const Value&)> recurse_;

 private:
  std::vector<Value> items_;
  int depth_;
  Value last_changed_;
  bool has_last_changed_ = false;
};

}  // namespace

// Counts nested evaluation so that no template can exhaust the C++ stack.
struct Interpreter::Nesting {
  explicit Nesting(Interpreter& in) : interp(in) {
    if (++interp.nesting_ > interp.limits_.max_nesting) {
      throw TemplateLimitError("template evaluation nested deeper than " + std::to_string(interp.limits_.max_nesting) +
                                   " levels",
                               interp.current_line_);
    }
  }
  ~Nesting() { --interp.nesting_; }
  Interpreter& interp;
};

Interpreter::Interpreter(const Template& tpl, const Dict& variables, const Limits& limits)
    : template_(tpl), limits_(limits) {
  globals_ = new_scope(nullptr);
  globals_->captured = true;
  add_jinja_globals(*globals_);
  context_ = new_scope(globals_);
  context_->captured = true;
  for (const auto& [key, value] : variables.items()) context_->set(str(key), value);
}

Interpreter::~Interpreter() {
  for (auto& object : objects_) object->release();
}

std::string Interpreter::render() {
  std::string out;
  out_ = &out;
  Scope* root = new_scope(context_);
  root->captured = true;
  const ValueLimits value_limits(limits_.max_output_bytes, limits_.max_steps);
  try {
    exec_body(template_.body, root);
  } catch (const TemplateError&) {
    throw;
  } catch (const LimitFailure& f) {
    throw TemplateLimitError(f.what(), current_line_);
  } catch (const Failure& f) {
    throw TemplateRenderError(f.what(), current_line_);
  } catch (const std::bad_alloc&) {
    throw TemplateLimitError("out of memory while rendering", current_line_);
  } catch (const std::exception& e) {
    // A library exception that escaped a check: still one clear error.
    throw TemplateRenderError(std::string("internal error: ") + e.what(), current_line_);
  }
  return out;
}

// ------------------------------------------------------------ bookkeeping

void Interpreter::step() {
  if (++steps_ > limits_.max_steps) {
    throw TemplateLimitError("template exceeded its budget of " + std::to_string(limits_.max_steps) +
                                 " evaluation steps (does it loop without end?)",
                             current_line_);
  }
}

void Interpreter::check_size(size_t bytes) const {
  if (bytes > limits_.max_output_bytes) {
    throw TemplateLimitError("template output exceeds the limit of " + std::to_string(limits_.max_output_bytes) +
                                 " bytes",
                             current_line_);
  }
}

void Interpreter::account(size_t bytes) {
  built_bytes_ += bytes;
  if (bytes > limits_.max_built_bytes || built_bytes_ > limits_.max_built_bytes) {
    throw TemplateLimitError("template built more than " + std::to_string(limits_.max_built_bytes) +
                                 " bytes of text and lists while rendering",
                             current_line_);
  }
}

std::vector<Value> Interpreter::iterate(const Value& v) {
  if (v.is_string()) account(v.as_string().size() * sizeof(Value));
  std::vector<Value> items = jinja::iterate(v);
  if (!v.is_string()) account(items.size() * sizeof(Value));
  return items;
}

namespace {

// What a new value costs, shallowly (its items are counted where built).
size_t value_bytes(const Value& v) {
  if (v.is_string()) return v.as_string().size();
  if (v.is_list()) return v.as_list().items.size() * sizeof(Value);
  if (v.is_dict()) return v.as_dict().size() * 2 * sizeof(Value);
  return 0;
}

}  // namespace

void Interpreter::write(const std::string& text) {
  account(text.size());
  check_size(out_->size() + text.size());
  *out_ += text;
}

std::string Interpreter::capture(const Body& body, Scope* scope) {
  std::string buffer;
  std::string* saved = out_;
  out_ = &buffer;
  try {
    exec_body(body, scope);
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return buffer;
}

Scope* Interpreter::new_scope(Scope* parent) {
  Scope* s;
  if (!free_scopes_.empty()) {
    s = free_scopes_.back();
    free_scopes_.pop_back();
  } else {
    scopes_.push_back(std::make_unique<Scope>());
    s = scopes_.back().get();
  }
  s->parent = parent;
  return s;
}

void Interpreter::release_scope(Scope* scope) {
  if (scope->captured) return;
  scope->vars.clear();
  scope->parent = nullptr;
  free_scopes_.push_back(scope);
}

void Interpreter::mark_captured(Scope* scope) {
  for (Scope* s = scope; s != nullptr && !s->captured; s = s->parent) s->captured = true;
}

// ------------------------------------------------------------ statements

Interpreter::Flow Interpreter::exec_body(const Body& body, Scope* scope) {
  for (const auto& s : body) {
    const Flow f = exec(*s, scope);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec(const Stmt& s, Scope* scope) {
  Nesting nesting(*this);
  step();
  current_line_ = s.line;
  switch (s.kind) {
    case Stmt::Kind::Text:
      write(static_cast<const TextStmt&>(s).text);
      return Flow::Normal;
    case Stmt::Kind::Print: {
      const Value v = eval(*static_cast<const PrintStmt&>(s).expr, scope);
      write(str(v));
      return Flow::Normal;
    }
    case Stmt::Kind::If: {
      const auto& n = static_cast<const IfStmt&>(s);
      for (const auto& [test, body] : n.branches) {
        if (truthy(eval(*test, scope))) return exec_body(body, scope);
      }
      return exec_body(n.else_body, scope);
    }
    case Stmt::Kind::For:
      exec_for(static_cast<const ForStmt&>(s), scope);
      return Flow::Normal;
    case Stmt::Kind::Set: {
      const auto& n = static_cast<const SetStmt&>(s);
      assign(n.target, eval(*n.value, scope), scope);
      return Flow::Normal;
    }
    case Stmt::Kind::SetBlock: {
      const auto& n = static_cast<const SetBlockStmt&>(s);
      Scope* inner = new_scope(scope);
      Value v(capture(n.body, inner));
      release_scope(inner);
      if (n.filter) v = apply_filter_chain(*n.filter, std::move(v), scope);
      assign(n.target, v, scope);
      return Flow::Normal;
    }
    case Stmt::Kind::Macro: {
      const auto& n = static_cast<const MacroStmt&>(s);
      scope->set(n.name, make_macro(n.name, &n.signature, &n.body, scope));
      return Flow::Normal;
    }
    case Stmt::Kind::CallBlock:
      exec_call_block(static_cast<const CallBlockStmt&>(s), scope);
      return Flow::Normal;
    case Stmt::Kind::FilterBlock: {
      const auto& n = static_cast<const FilterBlockStmt&>(s);
      Scope* inner = new_scope(scope);
      Value body(capture(n.body, inner));
      release_scope(inner);
      write(str(apply_filter_chain(*n.filter, std::move(body), scope)));
      return Flow::Normal;
    }
    case Stmt::Kind::With: {
      const auto& n = static_cast<const WithStmt&>(s);
      std::vector<Value> values;
      for (const auto& a : n.assignments) values.push_back(eval(*a.second, scope));
      Scope* inner = new_scope(scope);
      for (size_t i = 0; i < values.size(); ++i) assign(n.assignments[i].first, values[i], inner);
      const Flow f = exec_body(n.body, inner);
      release_scope(inner);
      return f;
    }
    case Stmt::Kind::Block: {
      Scope* inner = new_scope(scope);
      const Flow f = exec_body(static_cast<const BlockStmt&>(s).body, inner);
      release_scope(inner);
      return f;
    }
    case Stmt::Kind::Break:
      return Flow::Break;
    case Stmt::Kind::Continue:
      return Flow::Continue;
  }
  return Flow::Normal;
}

void Interpreter::exec_for(const ForStmt& s, Scope* scope) {
  const Value iterable = eval(*s.iter, scope);
  run_loop(s, iterable, scope, 0, false);
}

std::string Interpreter::run_loop(const ForStmt& s, const Value& iterable, Scope* scope, int depth, bool capture_output) {
  current_line_ = s.line;
  std::vector<Value> items = iterate(iterable);  // accounted
  if (s.filter) {
    std::vector<Value> kept;
    for (auto& item : items) {
      step();
      Scope* probe = new_scope(scope);
      assign(s.target, item, probe);
      const bool keep = truthy(eval(*s.filter, probe));
      release_scope(probe);
      if (keep) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }

  std::string buffer;
  std::string* saved = out_;
  if (capture_output) out_ = &buffer;
  std::shared_ptr<LoopState> loop;
  try {
    loop = std::make_shared<LoopState>(std::move(items), depth);
    loop->self_ = loop;
    if (s.recursive) {
      loop->recurse_ = [this, &s, scope, depth](Interpreter&, const Value& sub) -> Value {
        if (++call_depth_ > limits_.max_call_depth) {
          --call_depth_;
          throw TemplateLimitError("recursive loop nested deeper than " + std::to_string(limits_.max_call_depth) +
                                       " levels",
                                   current_line_);
        }
        std::string text;
        try {
          text = run_loop(s, sub, scope, depth + 1, true);
        } catch (...) {
          --call_depth_;
          throw;
        }
        --call_depth_;
        return Value(std::move(text));
      };
      mark_captured(scope);
    }
    const Value loop_value(std::static_pointer_cast<Object>(loop));
    const size_t n = loop->items().size();
    for (size_t i = 0; i < n; ++i) {
      step();
      loop->index_ = i;
      Scope* inner = new_scope(scope);
      assign(s.target, loop->items()[i], inner);
      inner->set("loop", loop_value);
      const Flow f = exec_body(s.body, inner);
      release_scope(inner);
      if (f == Flow::Break) break;
    }
    if (n == 0) {
      Scope* inner = new_scope(scope);
      exec_body(s.else_body, inner);
      release_scope(inner);
    }
  } catch (...) {
    out_ = saved;
    if (loop) adopt(loop);
    throw;
  }
  out_ = saved;
  // Still referenced (a macro's scope, a namespace): release it with the
  // render, in case the reference is a cycle.
  if (loop.use_count() > 1) adopt(loop);
  return buffer;
}

void Interpreter::assign(const Target& target, const Value& value, Scope* scope) {
  switch (target.kind) {
    case Target::Kind::Name:
      scope->set(target.name, value);
      return;
    case Target::Kind::Tuple: {
      const std::vector<Value> items = iterate(value);
      const size_t want = target.items.size();
      if (items.size() > want) {
        throw Failure("too many values to unpack (expected " + std::to_string(want) + ")");
      }
      if (items.size() < want) {
        throw Failure("not enough values to unpack (expected " + std::to_string(want) + ", got " +
                      std::to_string(items.size()) + ")");
      }
      for (size_t i = 0; i < want; ++i) assign(target.items[i], items[i], scope);
      return;
    }
    case Target::Kind::NamespaceAttr: {
      const Value ns = lookup(target.name, scope);
      if (!ns.is_object() || !ns.as_object().is_namespace()) {
        throw Failure("cannot assign attribute on non-namespace object");
      }
      ns.as_object().set_attr(target.attr, value);
      return;
    }
  }
}

// ------------------------------------------------------------ macros

Value Interpreter::make_macro(const std::string& name, const MacroSignature* signature, const Body* body,
                              Scope* scope) {
  mark_captured(scope);
  return Value::function(name, [name, signature, body, scope](Interpreter& in, CallArgs& args) -> Value {
    return in.call_macro(name, *signature, *body, scope, args);
  });
}

// Binds arguments as Jinja2 macros do: positional, then keyword, then
// defaults (evaluated in the macro's scope, so they may use earlier
// parameters); extra positional arguments land in `varargs`, extra keyword
// arguments in `kwargs`, and a call block's body in `caller`.
Value Interpreter::call_macro(const std::string& name, const MacroSignature& signature, const Body& body,
                              Scope* scope, CallArgs& args) {
  const std::vector<MacroParam>& params = signature.params;
  if (args.positional.size() > params.size() && !signature.catch_varargs) {
    throw Failure("macro '" + name + "' takes not more than " + std::to_string(params.size()) + " argument(s)");
  }
  if (++call_depth_ > limits_.max_call_depth) {
    --call_depth_;
    throw TemplateLimitError("macro calls nested deeper than " + std::to_string(limits_.max_call_depth) +
                                 " levels (endless recursion?)",
                             current_line_);
  }
  struct DepthRelease {
    int& depth;
    ~DepthRelease() { --depth; }
  } release{call_depth_};

  Scope* inner = new_scope(scope);
  std::vector<bool> bound(params.size(), false);
  std::vector<Value> extra_positional;
  for (size_t i = 0; i < args.positional.size(); ++i) {
    if (i < params.size()) {
      inner->set(params[i].name, args.positional[i]);
      bound[i] = true;
    } else {
      extra_positional.push_back(args.positional[i]);
    }
  }
  Dict extra_keyword;
  Value caller;
  for (auto& [key, value] : args.keyword) {
    bool matched = false;
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].name == key) {
        if (bound[i]) throw Failure("macro '" + name + "' got multiple values for argument '" + key + "'");
        inner->set(key, value);
        bound[i] = true;
        matched = true;
        break;
      }
    }
    if (matched) continue;
    if (key == "caller") {
      if (!signature.catch_caller) {
        throw Failure("macro '" + name + "' was invoked with two values for the special caller argument. "
                      "This is most likely a bug.");
      }
      caller = value;
    } else {
      if (!signature.catch_kwargs) throw Failure("macro '" + name + "' takes no keyword argument '" + key + "'");
      extra_keyword.set(Value(key), value);
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (bound[i]) continue;
    if (params[i].default_value) {
      inner->set(params[i].name, eval(*params[i].default_value, inner));
    } else {
      inner->set(params[i].name, Value::undefined("parameter '" + params[i].name + "' was not provided"));
    }
  }
  inner->set("varargs", Value::list(std::move(extra_positional), true));
  inner->set("kwargs", make_dict(std::move(extra_keyword)));
  if (!caller.is_undefined()) inner->set("caller", caller);
  std::string text = capture(body, inner);
  release_scope(inner);
  return Value(std::move(text));
}

void Interpreter::exec_call_block(const CallBlockStmt& s, Scope* scope) {
  const auto& call_expr = static_cast<const CallExpr&>(*s.call);
  const Value callee = eval(*call_expr.callee, scope);
  CallArgs args = eval_args(call_expr.args, scope);
  args.keyword.emplace_back("caller", make_macro("caller", &s.signature, &s.body, scope));
  write(str(this->call(callee, args)));
}

Value Interpreter::call(const Value& callee, CallArgs& args) {
  step();
  switch (callee.kind()) {
    case Value::Kind::Function:
      return callee.as_function().call(*this, args);
    case Value::Kind::Object:
      return callee.as_object().call(*this, args);
    case Value::Kind::Undefined:
      fail_undefined(callee);
    default:
      throw Failure("'" + type_name(callee) + "' object is not callable");
  }
}

// ------------------------------------------------------------ expressions

Value Interpreter::lookup(const std::string& name, Scope* scope) const {
  for (Scope* s = scope; s != nullptr; s = s->parent) {
    if (const Value* v = s->find(name)) return *v;
  }
  return Value::undefined("'" + name + "' is undefined");
}

Value Interpreter::eval(const Expr& e, Scope* scope) {
  Nesting nesting(*this);
  step();
  current_line_ = e.line;
  return eval_inner(e, scope);
}

CallArgs Interpreter::eval_args(const CallArguments& a, Scope* scope) {
  CallArgs out;
  for (const auto& p : a.positional) out.positional.push_back(eval(*p, scope));
  for (const auto& [key, value] : a.keyword) out.keyword.emplace_back(key, eval(*value, scope));
  if (a.star_args) {
    for (auto& v : iterate(eval(*a.star_args, scope))) out.positional.push_back(std::move(v));  // accounted
  }
  if (a.star_kwargs) {
    const Value d = eval(*a.star_kwargs, scope);
    if (!d.is_dict()) throw Failure("argument after ** must be a mapping, not " + type_name(d));
    for (const auto& [key, value] : d.as_dict().items()) {
      if (!key.is_string()) throw Failure("keywords must be strings");
      out.keyword.emplace_back(key.as_string(), value);
    }
  }
  return out;
}

Value Interpreter::apply_filter_chain(const Expr& chain, Value input, Scope* scope) {
  const auto& f = static_cast<const FilterExpr&>(chain);
  Value v = f.input ? apply_filter_chain(*f.input, std::move(input), scope) : std::move(input);
  CallArgs args = eval_args(f.args, scope);
  current_line_ = f.line;
  return apply_filter(*this, f.name, v, args);
}

Value Interpreter::eval_getitem(const GetitemExpr& e, Scope* scope) {
  const Value object = eval(*e.object, scope);
  if (e.index->kind == Expr::Kind::Slice) {
    const auto& s = static_cast<const SliceExpr&>(*e.index);
    const Value start = s.start ? eval(*s.start, scope) : Value(None{});
    const Value stop = s.stop ? eval(*s.stop, scope) : Value(None{});
    const Value step_value = s.step ? eval(*s.step, scope) : Value(None{});
    if (object.is_undefined()) fail_undefined(object);
    return get_slice(object, start, stop, step_value);
  }
  const Value key = eval(*e.index, scope);
  return get_item(object, key);
}

Value Interpreter::eval_compare(const CompareExpr& e, Scope* scope) {
  Value left = eval(*e.first, scope);
  for (const auto& [op, operand] : e.ops) {
    Value right = eval(*operand, scope);
    bool result;
    if (op == "==") result = equal(left, right);
    else if (op == "!=") result = !equal(left, right);
    else if (op == "<") result = less(left, right, "<");
    else if (op == ">") result = less(right, left, ">");
    else if (op == "<=") result = !less(right, left, "<=");
    else if (op == ">=") result = !less(left, right, ">=");
    else if (op == "in") result = contains(right, left);
    else result = !contains(right, left);  // notin
    if (!result) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

Value Interpreter::eval_inner(const Expr& e, Scope* scope) {
  switch (e.kind) {
    case Expr::Kind::Const:
      return static_cast<const ConstExpr&>(e).value;
    case Expr::Kind::Name:
      return lookup(static_cast<const NameExpr&>(e).name, scope);
    case Expr::Kind::List: {
      const auto& n = static_cast<const ListExpr&>(e);
      std::vector<Value> items;
      items.reserve(n.items.size());
      for (const auto& item : n.items) items.push_back(eval(*item, scope));
      account(items.size() * sizeof(Value));
      return Value::list(std::move(items), n.is_tuple);
    }
    case Expr::Kind::Dict: {
      Dict d;
      for (const auto& [key, value] : static_cast<const DictExpr&>(e).items) {
        Value k = eval(*key, scope);
        d.set(std::move(k), eval(*value, scope));
      }
      return make_dict(std::move(d));
    }
    case Expr::Kind::Getattr: {
      const auto& n = static_cast<const GetattrExpr&>(e);
      const Value object = eval(*n.object, scope);
      current_line_ = e.line;
      if (object.is_undefined()) fail_undefined(object);
      return get_attr(object, n.name);
    }
    case Expr::Kind::Getitem: {
      Value v = eval_getitem(static_cast<const GetitemExpr&>(e), scope);
      if (static_cast<const GetitemExpr&>(e).index->kind == Expr::Kind::Slice) account(value_bytes(v));
      return v;
    }
    case Expr::Kind::Slice:
      throw Failure("a slice is only valid inside []");
    case Expr::Kind::Call: {
      const auto& n = static_cast<const CallExpr&>(e);
      const Value callee = eval(*n.callee, scope);
      CallArgs args = eval_args(n.args, scope);
      current_line_ = e.line;
      Value v = call(callee, args);
      account(value_bytes(v));
      return v;
    }
    case Expr::Kind::Filter: {
      const auto& n = static_cast<const FilterExpr&>(e);
      const Value input = n.input ? eval(*n.input, scope) : Value();
      CallArgs args = eval_args(n.args, scope);
      current_line_ = e.line;
      Value v = apply_filter(*this, n.name, input, args);
      account(value_bytes(v));
      return v;
    }
    case Expr::Kind::Test: {
      const auto& n = static_cast<const TestExpr&>(e);
      const Value input = eval(*n.input, scope);
      CallArgs args = eval_args(n.args, scope);
      current_line_ = e.line;
      return Value(apply_test(*this, n.name, input, args));
    }
    case Expr::Kind::Unary: {
      const auto& n = static_cast<const UnaryExpr&>(e);
      return unary_op(n.op, eval(*n.operand, scope));
    }
    case Expr::Kind::Binary: {
      const auto& n = static_cast<const BinaryExpr&>(e);
      const Value a = eval(*n.left, scope);
      const Value b = eval(*n.right, scope);
      current_line_ = e.line;
      Value v = binary_op(*this, n.op, a, b);
      account(value_bytes(v));
      return v;
    }
    case Expr::Kind::Concat: {
      std::string out;
      for (const auto& part : static_cast<const ConcatExpr&>(e).parts) {
        out += str(eval(*part, scope));
        check_size(out.size());
      }
      account(out.size());
      return Value(std::move(out));
    }
    case Expr::Kind::Compare:
      return eval_compare(static_cast<const CompareExpr&>(e), scope);
    case Expr::Kind::And: {
      const auto& n = static_cast<const LogicExpr&>(e);
      Value left = eval(*n.left, scope);
      return truthy(left) ? eval(*n.right, scope) : left;
    }
    case Expr::Kind::Or: {
      const auto& n = static_cast<const LogicExpr&>(e);
      Value left = eval(*n.left, scope);
      return truthy(left) ? left : eval(*n.right, scope);
    }
    case Expr::Kind::Not:
      return Value(!truthy(eval(*static_cast<const NotExpr&>(e).operand, scope)));
    case Expr::Kind::Cond: {
      const auto& n = static_cast<const CondExpr&>(e);
      if (truthy(eval(*n.test, scope))) return eval(*n.then_value, scope);
      if (n.else_value) return eval(*n.else_value, scope);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                              " evaluated to false and no else section was defined.");
    }
  }
  return Value();
}

}  // namespace m40::chat::jinja
