// Recursive descent with Jinja2's precedence, loosest first:
//   conditional (a if b else c), or, and, not, comparisons (== != < <= > >=
//   in, not in), + and -, ~, * / // %, **, unary - and +, then postfix
//   (.attr, [index], (call)) followed by filters (|f), tests (is t) and calls.
// So filters and tests bind tighter than any binary operator:
// `'a' + x | trim` trims only x, and `not x is defined` is `not (x is defined)`.
#include "chat/jinja/parser.h"

#include <algorithm>
#include <initializer_list>

#include "chat/jinja/builtins.h"
#include "chat/jinja/template_error.h"

namespace m40::chat::jinja {

namespace {

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Template run() {
    Template t;
    t.body = subparse({});
    if (cur().type != TokenType::End) fail("unexpected '" + describe(cur()) + "'");
    return t;
  }

 private:
  // ------------------------------------------------------------ tokens

  const Token& cur() const { return tokens_[pos_]; }
  const Token& peek() const { return tokens_[pos_ + 1 < tokens_.size() ? pos_ + 1 : pos_]; }
  const Token& next() {
    const Token& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }

  bool is_op(const char* op) const { return cur().type == TokenType::Operator && cur().text == op; }
  bool is_name(const char* name) const { return cur().type == TokenType::Name && cur().text == name; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case TokenType::VariableEnd: return "end of print statement";
      case TokenType::BlockEnd: return "end of statement block";
      case TokenType::End: return "end of template";
      case TokenType::Data: return "template data";
      case TokenType::VariableBegin: return "begin of print statement";
      case TokenType::BlockBegin: return "begin of statement block";
      case TokenType::String: return "string";
      default: return t.text;
    }
  }

  [[noreturn]] void fail(const std::string& message) const { fail_at(cur(), message); }
  [[noreturn]] static void fail_at(const Token& t, const std::string& message) {
    throw TemplateSyntaxError(message, t.line, t.column);
  }

  void expect_op(const char* op) {
    if (!skip_op(op)) fail(std::string("expected '") + op + "', got '" + describe(cur()) + "'");
  }
  std::string expect_name() {
    if (cur().type != TokenType::Name) fail("expected a name, got '" + describe(cur()) + "'");
    return next().text;
  }
  void expect(TokenType type) {
    if (cur().type != type) {
      Token want;
      want.type = type;
      fail("expected '" + describe(want) + "', got '" + describe(cur()) + "'");
    }
    next();
  }

  // Bounds recursion: every nested expression or block passes through here.
  struct DepthGuard {
    explicit DepthGuard(Parser& p) : parser(p) {
      if (++parser.depth_ > kMaxParseDepth) parser.fail("template nested too deeply");
    }
    ~DepthGuard() { --parser.depth_; }
    Parser& parser;
  };

  // ------------------------------------------------------------ statements

  // Parses until a {% NAME %} with NAME in end_names (the block-begin is
  // consumed, the name is left current) or the end of the template.
  Body subparse(std::initializer_list<const char*> end_names) {
    Body body;
    while (cur().type != TokenType::End) {
      const Token& t = cur();
      if (t.type == TokenType::Data) {
        body.push_back(std::make_unique<TextStmt>(t.text, t.line));
        next();
      } else if (t.type == TokenType::VariableBegin) {
        const int line = t.line;
        next();
        ExprPtr e = parse_tuple(true, {}, false);
        expect(TokenType::VariableEnd);
        body.push_back(std::make_unique<PrintStmt>(std::move(e), line));
      } else if (t.type == TokenType::BlockBegin) {
        next();
        if (cur().type == TokenType::Name) {
          for (const char* end : end_names)
            if (cur().text == end) return body;
        }
        body.push_back(parse_statement());
        expect(TokenType::BlockEnd);
      } else {
        fail("unexpected '" + describe(t) + "'");
      }
    }
    return body;
  }

  // After the statement's own tag: `%}`, the body, and the end tag's name
  // (left current, or consumed when drop_needle).
  Body parse_statements(std::initializer_list<const char*> end_names, bool drop_needle) {
    DepthGuard guard(*this);
    skip_op(":");
    expect(TokenType::BlockEnd);
    Body body = subparse(end_names);
    if (cur().type == TokenType::End) {
      std::string wanted;
      for (const char* e : end_names) wanted += std::string(wanted.empty() ? "" : " or ") + "'" + e + "'";
      fail("unexpected end of template: looking for " + wanted + " to close the '" + tag_stack_.back().first +
           "' block opened at line " + std::to_string(tag_stack_.back().second));
    }
    if (drop_needle) next();
    return body;
  }

  StmtPtr parse_statement() {
    const Token& t = cur();
    if (t.type != TokenType::Name) fail("tag name expected");
    const std::string tag = t.text;
    const int line = t.line;
    static const char* const kEndTags[] = {"endif", "endfor", "endmacro", "endset", "endcall", "endfilter",
                                           "endwith", "else", "elif", "endraw", "endgeneration", "endblock"};
    for (const char* end : kEndTags) {
      if (tag == end) {
        if (tag_stack_.empty()) fail("unexpected '" + tag + "': no block is open");
        fail("unexpected '" + tag + "' inside the '" + tag_stack_.back().first + "' block opened at line " +
             std::to_string(tag_stack_.back().second));
      }
    }
    tag_stack_.emplace_back(tag, line);
    StmtPtr s;
    if (tag == "if") s = parse_if();
    else if (tag == "for") s = parse_for();
    else if (tag == "set") s = parse_set();
    else if (tag == "macro") s = parse_macro();
    else if (tag == "call") s = parse_call_block();
    else if (tag == "filter") s = parse_filter_block();
    else if (tag == "with") s = parse_with();
    else if (tag == "print") s = parse_print();
    else if (tag == "generation") s = parse_generation();
    else if (tag == "break" || tag == "continue") s = parse_loop_control(tag == "break");
    else if (tag == "include" || tag == "import" || tag == "from" || tag == "extends" || tag == "block") {
      fail("'" + tag + "' is not supported in chat templates (a template is rendered on its own)");
    } else {
      fail("unknown tag '" + tag + "'");
    }
    tag_stack_.pop_back();
    return s;
  }

  StmtPtr parse_if() {
    auto s = std::make_unique<IfStmt>(next().line);
    while (true) {
      ExprPtr test = parse_tuple(false, {}, false);
      Body body = parse_statements({"elif", "else", "endif"}, false);
      s->branches.emplace_back(std::move(test), std::move(body));
      const std::string which = next().text;
      if (which == "elif") continue;
      if (which == "else") s->else_body = parse_statements({"endif"}, true);
      break;
    }
    return s;
  }

  StmtPtr parse_for() {
    auto s = std::make_unique<ForStmt>(next().line);
    s->target = parse_assign_target(false, {"in"});
    if (!skip_name("in")) fail("expected 'in', got '" + describe(cur()) + "'");
    s->iter = parse_tuple(false, {"recursive"}, false);
    if (skip_name("if")) s->filter = parse_expression(true);
    s->recursive = skip_name("recursive");
    ++loop_depth_;
    s->body = parse_statements({"endfor", "else"}, false);
    --loop_depth_;
    if (next().text == "else") s->else_body = parse_statements({"endfor"}, true);
    return s;
  }

  StmtPtr parse_set() {
    const int line = next().line;
    Target target = parse_assign_target(true, {});
    if (skip_op("=")) {
      auto s = std::make_unique<SetStmt>(line);
      s->target = std::move(target);
      s->value = parse_tuple(true, {}, false);
      return s;
    }
    auto s = std::make_unique<SetBlockStmt>(line);
    s->target = std::move(target);
    if (is_op("|")) s->filter = parse_filter(nullptr, false);
    const int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_statements({"endset"}, true);
    loop_depth_ = saved;
    return s;
  }

  // ------------------------------------------------------------ names a body reads

  static void collect_names(const Expr* e, std::vector<std::string>& names) {
    if (e == nullptr) return;
    if (e->kind == Expr::Kind::Name) {
      names.push_back(static_cast<const NameExpr*>(e)->name);
      return;
    }
    for_each_child(*e, [&](const Expr* child) { collect_names(child, names); });
  }

  static void collect_names(const std::vector<MacroParam>& params, std::vector<std::string>& names) {
    for (const auto& p : params) collect_names(p.default_value.get(), names);
  }

  static void collect_names(const Body& body, std::vector<std::string>& names) {
    for (const auto& st : body) {
      const Stmt& s = *st;
      switch (s.kind) {
        case Stmt::Kind::Text:
        case Stmt::Kind::Break:
        case Stmt::Kind::Continue:
          break;
        case Stmt::Kind::Print: collect_names(static_cast<const PrintStmt&>(s).expr.get(), names); break;
        case Stmt::Kind::If: {
          const auto& n = static_cast<const IfStmt&>(s);
          for (const auto& [test, b] : n.branches) {
            collect_names(test.get(), names);
            collect_names(b, names);
          }
          collect_names(n.else_body, names);
          break;
        }
        case Stmt::Kind::For: {
          const auto& n = static_cast<const ForStmt&>(s);
          collect_names(n.iter.get(), names);
          collect_names(n.filter.get(), names);
          collect_names(n.body, names);
          collect_names(n.else_body, names);
          break;
        }
        case Stmt::Kind::Set: collect_names(static_cast<const SetStmt&>(s).value.get(), names); break;
        case Stmt::Kind::SetBlock: {
          const auto& n = static_cast<const SetBlockStmt&>(s);
          collect_names(n.filter.get(), names);
          collect_names(n.body, names);
          break;
        }
        case Stmt::Kind::Macro: {
          const auto& n = static_cast<const MacroStmt&>(s);
          collect_names(n.signature.params, names);
          collect_names(n.body, names);
          break;
        }
        case Stmt::Kind::CallBlock: {
          const auto& n = static_cast<const CallBlockStmt&>(s);
          collect_names(n.call.get(), names);
          collect_names(n.signature.params, names);
          collect_names(n.body, names);
          break;
        }
        case Stmt::Kind::FilterBlock: {
          const auto& n = static_cast<const FilterBlockStmt&>(s);
          collect_names(n.filter.get(), names);
          collect_names(n.body, names);
          break;
        }
        case Stmt::Kind::With: {
          const auto& n = static_cast<const WithStmt&>(s);
          for (const auto& a : n.assignments) collect_names(a.second.get(), names);
          collect_names(n.body, names);
          break;
        }
        case Stmt::Kind::Block: collect_names(static_cast<const BlockStmt&>(s).body, names); break;
      }
    }
  }

  static void mark_special_names(MacroSignature& sig, const Body& body) {
    std::vector<std::string> names;
    collect_names(body, names);
    for (const auto& n : names) {
      sig.catch_varargs = sig.catch_varargs || n == "varargs";
      sig.catch_kwargs = sig.catch_kwargs || n == "kwargs";
      sig.catch_caller = sig.catch_caller || n == "caller";
    }
  }

  std::vector<MacroParam> parse_signature() {
    std::vector<MacroParam> params;
    expect_op("(");
    bool defaults = false;
    while (!is_op(")")) {
      if (!params.empty()) expect_op(",");
      MacroParam p;
      p.name = expect_name();
      if (skip_op("=")) {
        p.default_value = parse_expression(true);
        defaults = true;
      } else if (defaults) {
        fail("non-default argument follows default argument");
      }
      params.push_back(std::move(p));
    }
    expect_op(")");
    return params;
  }

  StmtPtr parse_macro() {
    auto s = std::make_unique<MacroStmt>(next().line);
    s->name = expect_name();
    s->signature.params = parse_signature();
    const int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_statements({"endmacro"}, true);
    loop_depth_ = saved;
    mark_special_names(s->signature, s->body);
    return s;
  }

  StmtPtr parse_call_block() {
    auto s = std::make_unique<CallBlockStmt>(next().line);
    if (is_op("(")) s->signature.params = parse_signature();
    s->call = parse_expression(true);
    if (s->call->kind != Expr::Kind::Call) fail_at(cur(), "expected a call after 'call'");
    const int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_statements({"endcall"}, true);
    loop_depth_ = saved;
    mark_special_names(s->signature, s->body);
    return s;
  }

  StmtPtr parse_filter_block() {
    auto s = std::make_unique<FilterBlockStmt>(next().line);
    s->filter = parse_filter(nullptr, true);
    const int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_statements({"endfilter"}, true);
    loop_depth_ = saved;
    return s;
  }

  StmtPtr parse_with() {
    auto s = std::make_unique<WithStmt>(next().line);
    while (cur().type != TokenType::BlockEnd) {
      if (!s->assignments.empty()) expect_op(",");
      Target target = parse_assign_target(false, {});
      expect_op("=");
      s->assignments.emplace_back(std::move(target), parse_expression(true));
    }
    s->body = parse_statements({"endwith"}, true);
    return s;
  }

  StmtPtr parse_print() {
    const int line = next().line;
    auto list = std::make_unique<ListExpr>(false, line);
    while (cur().type != TokenType::BlockEnd) {
      if (!list->items.empty()) expect_op(",");
      list->items.push_back(parse_expression(true));
    }
    // {% print a, b %} prints each expression in turn.
    if (list->items.size() == 1) return std::make_unique<PrintStmt>(std::move(list->items[0]), line);
    auto block = std::make_unique<BlockStmt>(line);
    for (auto& e : list->items) block->body.push_back(std::make_unique<PrintStmt>(std::move(e), line));
    return block;
  }

  StmtPtr parse_generation() {
    auto s = std::make_unique<BlockStmt>(next().line);
    s->body = parse_statements({"endgeneration"}, true);
    return s;
  }

  StmtPtr parse_loop_control(bool is_break) {
    const Token& t = next();
    if (loop_depth_ == 0) fail_at(t, std::string("'") + (is_break ? "break" : "continue") + "' outside a loop");
    return std::make_unique<Stmt>(is_break ? Stmt::Kind::Break : Stmt::Kind::Continue, t.line);
  }

  // for targets: a name or a (possibly nested) tuple of names; set targets
  // may also be ns.attr.
  Target parse_assign_target(bool with_namespace, std::initializer_list<const char*> extra_end) {
    if (with_namespace && cur().type == TokenType::Name && peek().type == TokenType::Operator && peek().text == ".") {
      Target t;
      t.kind = Target::Kind::NamespaceAttr;
      t.name = next().text;
      next();  // the dot
      t.attr = expect_name();
      return t;
    }
    Target tuple;
    tuple.kind = Target::Kind::Tuple;
    bool is_tuple = false;
    while (true) {
      if (!tuple.items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      tuple.items.push_back(parse_target_primary());
      if (is_op(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (tuple.items.empty()) fail("expected a name to assign to, got '" + describe(cur()) + "'");
      return std::move(tuple.items[0]);
    }
    return tuple;
  }

  Target parse_target_primary() {
    DepthGuard guard(*this);
    if (skip_op("(")) {
      Target t = parse_assign_target(false, {});
      expect_op(")");
      return t;
    }
    if (cur().type != TokenType::Name) fail("can't assign to '" + describe(cur()) + "'");
    const std::string& n = cur().text;
    if (n == "true" || n == "false" || n == "none" || n == "True" || n == "False" || n == "None") {
      fail("can't assign to '" + n + "'");
    }
    Target t;
    t.kind = Target::Kind::Name;
    t.name = next().text;
    return t;
  }

  // ------------------------------------------------------------ expressions

  // Calls f(child) for each direct subexpression of e (null ones included).
  template <class F>
  static void for_each_child(const Expr& e, F&& f) {
    auto args = [&](const CallArguments& a) {
      for (const auto& p : a.positional) f(p.get());
      for (const auto& k : a.keyword) f(k.second.get());
      f(a.star_args.get());
      f(a.star_kwargs.get());
    };
    switch (e.kind) {
      case Expr::Kind::Const:
      case Expr::Kind::Name:
        break;
      case Expr::Kind::List:
        for (const auto& i : static_cast<const ListExpr&>(e).items) f(i.get());
        break;
      case Expr::Kind::Dict:
        for (const auto& [k, v] : static_cast<const DictExpr&>(e).items) {
          f(k.get());
          f(v.get());
        }
        break;
      case Expr::Kind::Getattr: f(static_cast<const GetattrExpr&>(e).object.get()); break;
      case Expr::Kind::Getitem:
        f(static_cast<const GetitemExpr&>(e).object.get());
        f(static_cast<const GetitemExpr&>(e).index.get());
        break;
      case Expr::Kind::Slice:
        f(static_cast<const SliceExpr&>(e).start.get());
        f(static_cast<const SliceExpr&>(e).stop.get());
        f(static_cast<const SliceExpr&>(e).step.get());
        break;
      case Expr::Kind::Call:
        f(static_cast<const CallExpr&>(e).callee.get());
        args(static_cast<const CallExpr&>(e).args);
        break;
      case Expr::Kind::Filter:
        f(static_cast<const FilterExpr&>(e).input.get());
        args(static_cast<const FilterExpr&>(e).args);
        break;
      case Expr::Kind::Test:
        f(static_cast<const TestExpr&>(e).input.get());
        args(static_cast<const TestExpr&>(e).args);
        break;
      case Expr::Kind::Unary: f(static_cast<const UnaryExpr&>(e).operand.get()); break;
      case Expr::Kind::Binary:
        f(static_cast<const BinaryExpr&>(e).left.get());
        f(static_cast<const BinaryExpr&>(e).right.get());
        break;
      case Expr::Kind::Concat:
        for (const auto& p : static_cast<const ConcatExpr&>(e).parts) f(p.get());
        break;
      case Expr::Kind::Compare:
        f(static_cast<const CompareExpr&>(e).first.get());
        for (const auto& op : static_cast<const CompareExpr&>(e).ops) f(op.second.get());
        break;
      case Expr::Kind::And:
      case Expr::Kind::Or:
        f(static_cast<const LogicExpr&>(e).left.get());
        f(static_cast<const LogicExpr&>(e).right.get());
        break;
      case Expr::Kind::Not: f(static_cast<const NotExpr&>(e).operand.get()); break;
      case Expr::Kind::Cond:
        f(static_cast<const CondExpr&>(e).test.get());
        f(static_cast<const CondExpr&>(e).then_value.get());
        f(static_cast<const CondExpr&>(e).else_value.get());
        break;
    }
  }

  // Sets the node's height from its children's and bounds it. Not inlined:
  // with the node's type known, GCC warns about the casts of other kinds.
  [[gnu::noinline]] void set_depth(Expr& e) {
    int d = 0;
    for_each_child(e, [&](const Expr* child) {
      if (child != nullptr) d = std::max(d, child->depth);
    });
    e.depth = d + 1;
    if (e.depth > kMaxExprDepth) {
      fail("expression nested too deeply (more than " + std::to_string(kMaxExprDepth) + " levels)");
    }
  }

  template <class T>
  std::unique_ptr<T> done(std::unique_ptr<T> node) {
    set_depth(*node);
    return node;
  }

  bool is_tuple_end(std::initializer_list<const char*> extra_end) const {
    const Token& t = cur();
    if (t.type == TokenType::VariableEnd || t.type == TokenType::BlockEnd || t.type == TokenType::End) return true;
    if (t.type == TokenType::Operator && t.text == ")") return true;
    if (t.type == TokenType::Name) {
      for (const char* e : extra_end)
        if (t.text == e) return true;
    }
    return false;
  }

  // Comma-separated expressions; more than one (or a trailing comma) makes
  // a tuple.
  ExprPtr parse_tuple(bool with_condexpr, std::initializer_list<const char*> extra_end, bool explicit_parens) {
    const int line = cur().line;
    auto tuple = std::make_unique<ListExpr>(true, line);
    bool is_tuple = false;
    while (true) {
      if (!tuple->items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      tuple->items.push_back(parse_expression(with_condexpr));
      if (is_op(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!tuple->items.empty()) return std::move(tuple->items[0]);
      if (!explicit_parens) fail("expected an expression, got '" + describe(cur()) + "'");
    }
    return done(std::move(tuple));
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    const int line = cur().line;
    ExprPtr expr = parse_or();
    while (skip_name("if")) {
      auto c = std::make_unique<CondExpr>(line);
      c->test = parse_or();
      if (skip_name("else")) c->else_value = parse_condexpr();
      c->then_value = std::move(expr);
      expr = done(std::move(c));
    }
    return expr;
  }

  ExprPtr parse_or() {
    const int line = cur().line;
    ExprPtr left = parse_and();
    while (skip_name("or")) left = done(std::make_unique<LogicExpr>(Expr::Kind::Or, std::move(left), parse_and(), line));
    return left;
  }

  ExprPtr parse_and() {
    const int line = cur().line;
    ExprPtr left = parse_not();
    while (skip_name("and")) left = done(std::make_unique<LogicExpr>(Expr::Kind::And, std::move(left), parse_not(), line));
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      const int line = next().line;
      DepthGuard guard(*this);
      return done(std::make_unique<NotExpr>(parse_not(), line));
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr first = parse_math1();
    std::unique_ptr<CompareExpr> cmp;
    while (true) {
      std::string op;
      if (cur().type == TokenType::Operator &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" || cur().text == ">" ||
           cur().text == ">=")) {
        op = next().text;
      } else if (skip_name("in")) {
        op = "in";
      } else if (is_name("not") && peek().type == TokenType::Name && peek().text == "in") {
        next();
        next();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) cmp = std::make_unique<CompareExpr>(std::move(first), line);
      cmp->ops.emplace_back(op, parse_math1());
    }
    if (!cmp) return first;
    return done(std::move(cmp));
  }

  ExprPtr parse_math1() {
    const int line = cur().line;
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = next().text;
      left = done(std::make_unique<BinaryExpr>(op, std::move(left), parse_concat(), line));
    }
    return left;
  }

  ExprPtr parse_concat() {
    const int line = cur().line;
    ExprPtr first = parse_math2();
    if (!is_op("~")) return first;
    auto c = std::make_unique<ConcatExpr>(line);
    c->parts.push_back(std::move(first));
    while (skip_op("~")) c->parts.push_back(parse_math2());
    return done(std::move(c));
  }

  ExprPtr parse_math2() {
    const int line = cur().line;
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = next().text;
      left = done(std::make_unique<BinaryExpr>(op, std::move(left), parse_pow(), line));
    }
    return left;
  }

  ExprPtr parse_pow() {
    const int line = cur().line;
    ExprPtr left = parse_unary(true);
    while (skip_op("**")) left = done(std::make_unique<BinaryExpr>("**", std::move(left), parse_unary(true), line));
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    const int line = cur().line;
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const char op = next().text[0];
      node = done(std::make_unique<UnaryExpr>(op, parse_unary(false), line));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    switch (t.type) {
      case TokenType::Name: {
        const std::string& n = t.text;
        const int line = t.line;
        ExprPtr e;
        if (n == "true" || n == "True") e = std::make_unique<ConstExpr>(Value(true), line);
        else if (n == "false" || n == "False") e = std::make_unique<ConstExpr>(Value(false), line);
        else if (n == "none" || n == "None") e = std::make_unique<ConstExpr>(Value(None{}), line);
        else e = std::make_unique<NameExpr>(n, line);
        next();
        return e;
      }
      case TokenType::String: {
        const int line = t.line;
        std::string s;
        while (cur().type == TokenType::String) s += next().text;  // adjacent literals join
        return std::make_unique<ConstExpr>(Value(std::move(s)), line);
      }
      case TokenType::Integer: {
        const Token& n = next();
        return std::make_unique<ConstExpr>(Value(n.int_value), n.line);
      }
      case TokenType::Float: {
        const Token& n = next();
        return std::make_unique<ConstExpr>(Value(n.float_value), n.line);
      }
      case TokenType::Operator:
        if (t.text == "(") {
          next();
          ExprPtr e = parse_tuple(true, {}, true);
          expect_op(")");
          return e;
        }
        if (t.text == "[") return parse_list();
        if (t.text == "{") return parse_dict();
        break;
      default:
        break;
    }
    fail("unexpected '" + describe(t) + "'");
  }

  ExprPtr parse_list() {
    auto l = std::make_unique<ListExpr>(false, next().line);
    while (!is_op("]")) {
      if (!l->items.empty()) expect_op(",");
      if (is_op("]")) break;
      l->items.push_back(parse_expression(true));
    }
    expect_op("]");
    return done(std::move(l));
  }

  ExprPtr parse_dict() {
    auto d = std::make_unique<DictExpr>(next().line);
    while (!is_op("}")) {
      if (!d->items.empty()) expect_op(",");
      if (is_op("}")) break;
      ExprPtr key = parse_expression(true);
      expect_op(":");
      d->items.emplace_back(std::move(key), parse_expression(true));
    }
    expect_op("}");
    return done(std::move(d));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        node = parse_filter(std::move(node), false);
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token& t = next();
    const int line = t.line;
    if (t.text == ".") {
      const Token& attr = next();
      if (attr.type == TokenType::Name) return done(std::make_unique<GetattrExpr>(std::move(node), attr.text, line));
      if (attr.type != TokenType::Integer) fail_at(attr, "expected a name or a number after '.'");
      return done(std::make_unique<GetitemExpr>(
          std::move(node), std::make_unique<ConstExpr>(Value(attr.int_value), line), line));
    }
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    if (args.size() == 1) return done(std::make_unique<GetitemExpr>(std::move(node), std::move(args[0]), line));
    auto tuple = std::make_unique<ListExpr>(true, line);
    tuple->items = std::move(args);
    return done(std::make_unique<GetitemExpr>(std::move(node), done(std::move(tuple)), line));
  }

  // An index or a start:stop:step slice.
  ExprPtr parse_subscribed() {
    const int line = cur().line;
    ExprPtr start;
    if (!skip_op(":")) {
      ExprPtr e = parse_expression(true);
      if (!skip_op(":")) return e;
      start = std::move(e);
    }
    auto s = std::make_unique<SliceExpr>(line);
    s->start = std::move(start);
    if (!is_op(":") && !is_op("]") && !is_op(",")) s->stop = parse_expression(true);
    if (skip_op(":")) {
      if (!is_op("]") && !is_op(",")) s->step = parse_expression(true);
    }
    return done(std::move(s));
  }

  CallArguments parse_call_args() {
    const Token& open = cur();
    expect_op("(");
    CallArguments a;
    bool require_comma = false;
    auto ensure = [&](bool ok) {
      if (!ok) fail_at(open, "invalid syntax for function call expression");
    };
    while (!is_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*")) {
        ensure(!a.star_args && !a.star_kwargs);
        next();
        a.star_args = parse_expression(true);
      } else if (is_op("**")) {
        ensure(!a.star_kwargs);
        next();
        a.star_kwargs = parse_expression(true);
      } else if (cur().type == TokenType::Name && peek().type == TokenType::Operator && peek().text == "=") {
        ensure(!a.star_kwargs);
        std::string key = next().text;
        next();
        a.keyword.emplace_back(std::move(key), parse_expression(true));
      } else {
        ensure(!a.star_args && !a.star_kwargs && a.keyword.empty());
        a.positional.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
    return a;
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto c = std::make_unique<CallExpr>(std::move(callee), cur().line);
    c->args = parse_call_args();
    return done(std::move(c));
  }

  // | name(args) | name2 ... ; with start_inline the first | is implied.
  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      const Token& t = cur();
      std::string name = expect_name();
      while (is_op(".")) {
        next();
        name.push_back('.');
        name += expect_name();
      }
      if (!is_filter_name(name)) fail_at(t, "no filter named '" + name + "'");
      auto f = std::make_unique<FilterExpr>(std::move(node), name, t.line);
      if (is_op("(")) f->args = parse_call_args();
      node = done(std::move(f));
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    const int line = next().line;  // "is"
    const bool negated = skip_name("not");
    const Token& name_token = cur();
    std::string name = expect_name();
    while (is_op(".")) {
      next();
      name.push_back('.');
        name += expect_name();
    }
    if (!is_test_name(name)) fail_at(name_token, "no test named '" + name + "'");
    auto t = std::make_unique<TestExpr>(std::move(node), name, line);
    const Token& c = cur();
    if (is_op("(")) {
      t->args = parse_call_args();
    } else if ((c.type == TokenType::Name || c.type == TokenType::String || c.type == TokenType::Integer ||
                c.type == TokenType::Float || (c.type == TokenType::Operator && (c.text == "(" || c.text == "[" ||
                                                                                   c.text == "{"))) &&
               !(c.type == TokenType::Name && (c.text == "else" || c.text == "or" || c.text == "and"))) {
      if (is_name("is")) fail("you cannot chain multiple tests with is");
      // `x is divisibleby 3`: one argument without parentheses.
      ExprPtr arg = parse_postfix(parse_primary());
      t->args.positional.push_back(std::move(arg));
    }
    if (negated) return done(std::make_unique<NotExpr>(done(std::move(t)), line));
    return done(std::move(t));
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::vector<std::pair<std::string, int>> tag_stack_;
};

}  // namespace

Template parse(std::string_view source, const LexOptions& options) {
  return Parser(tokenize(source, options)).run();
}

}  // namespace m40::chat::jinja
