// The syntax tree of a parsed template: expressions and statements, as
// Jinja2's parser builds them (same precedence, same node shapes).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja/value.h"

namespace m40::chat::jinja {

struct Expr {
  enum class Kind {
    Const, Name, List, Dict, Getattr, Getitem, Slice, Call, Filter, Test,
    Unary, Binary, Concat, Compare, And, Or, Not, Cond,
  };
  Expr(Kind k, int l) : kind(k), line(l) {}
  virtual ~Expr() = default;
  Kind kind;
  int line;
  int depth = 1;  // height of the subtree (the parser bounds it)
};
using ExprPtr = std::unique_ptr<Expr>;

struct ConstExpr : Expr {
  ConstExpr(Value v, int l) : Expr(Kind::Const, l), value(std::move(v)) {}
  Value value;
};

struct NameExpr : Expr {
  NameExpr(std::string n, int l) : Expr(Kind::Name, l), name(std::move(n)) {}
  std::string name;
};

// [a, b] or (a, b)
struct ListExpr : Expr {
  ListExpr(bool tuple, int l) : Expr(Kind::List, l), is_tuple(tuple) {}
  std::vector<ExprPtr> items;
  bool is_tuple;
};

struct DictExpr : Expr {
  explicit DictExpr(int l) : Expr(Kind::Dict, l) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};

// a.name
struct GetattrExpr : Expr {
  GetattrExpr(ExprPtr o, std::string n, int l) : Expr(Kind::Getattr, l), object(std::move(o)), name(std::move(n)) {}
  ExprPtr object;
  std::string name;
};

// a[index]; index may be a SliceExpr
struct GetitemExpr : Expr {
  GetitemExpr(ExprPtr o, ExprPtr i, int l) : Expr(Kind::Getitem, l), object(std::move(o)), index(std::move(i)) {}
  ExprPtr object;
  ExprPtr index;
};

// start:stop:step, each part optional
struct SliceExpr : Expr {
  explicit SliceExpr(int l) : Expr(Kind::Slice, l) {}
  ExprPtr start, stop, step;
};

struct CallArguments {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
  ExprPtr star_args;    // *args
  ExprPtr star_kwargs;  // **kwargs
};

struct CallExpr : Expr {
  CallExpr(ExprPtr c, int l) : Expr(Kind::Call, l), callee(std::move(c)) {}
  ExprPtr callee;
  CallArguments args;
};

// input | name(args); input is null in the filter chain of a filter block
// or a block set, where the rendered body is the input.
struct FilterExpr : Expr {
  FilterExpr(ExprPtr in, std::string n, int l) : Expr(Kind::Filter, l), input(std::move(in)), name(std::move(n)) {}
  ExprPtr input;
  std::string name;
  CallArguments args;
};

// input is name(args)  ("is not" wraps it in a NotExpr)
struct TestExpr : Expr {
  TestExpr(ExprPtr in, std::string n, int l) : Expr(Kind::Test, l), input(std::move(in)), name(std::move(n)) {}
  ExprPtr input;
  std::string name;
  CallArguments args;
};

// -x, +x
struct UnaryExpr : Expr {
  UnaryExpr(char o, ExprPtr e, int l) : Expr(Kind::Unary, l), op(o), operand(std::move(e)) {}
  char op;
  ExprPtr operand;
};

// + - * / // % **
struct BinaryExpr : Expr {
  BinaryExpr(std::string o, ExprPtr a, ExprPtr b, int l)
      : Expr(Kind::Binary, l), op(std::move(o)), left(std::move(a)), right(std::move(b)) {}
  std::string op;
  ExprPtr left, right;
};

// a ~ b ~ c
struct ConcatExpr : Expr {
  explicit ConcatExpr(int l) : Expr(Kind::Concat, l) {}
  std::vector<ExprPtr> parts;
};

// a < b == c ... with ops ==, !=, <, <=, >, >=, in, notin
struct CompareExpr : Expr {
  CompareExpr(ExprPtr f, int l) : Expr(Kind::Compare, l), first(std::move(f)) {}
  ExprPtr first;
  std::vector<std::pair<std::string, ExprPtr>> ops;
};

// a and b / a or b (Kind::And or Kind::Or)
struct LogicExpr : Expr {
  LogicExpr(Kind k, ExprPtr a, ExprPtr b, int l) : Expr(k, l), left(std::move(a)), right(std::move(b)) {}
  ExprPtr left, right;
};

struct NotExpr : Expr {
  NotExpr(ExprPtr e, int l) : Expr(Kind::Not, l), operand(std::move(e)) {}
  ExprPtr operand;
};

// then if test else otherwise (otherwise may be null: undefined)
struct CondExpr : Expr {
  explicit CondExpr(int l) : Expr(Kind::Cond, l) {}
  ExprPtr test, then_value, else_value;
};

// ---------------------------------------------------------------- statements

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

// What a for, set or with assigns to: a name, a tuple of targets, or a
// namespace attribute (set ns.attr = ...).
struct Target {
  enum class Kind { Name, Tuple, NamespaceAttr } kind = Kind::Name;
  std::string name;
  std::string attr;
  std::vector<Target> items;
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Stmt {
  enum class Kind { Text, Print, If, For, Set, SetBlock, Macro, CallBlock, FilterBlock, With, Break, Continue, Block };
  Stmt(Kind k, int l) : kind(k), line(l) {}
  virtual ~Stmt() = default;
  Kind kind;
  int line;
};

struct TextStmt : Stmt {
  TextStmt(std::string t, int l) : Stmt(Kind::Text, l), text(std::move(t)) {}
  std::string text;
};

struct PrintStmt : Stmt {
  PrintStmt(ExprPtr e, int l) : Stmt(Kind::Print, l), expr(std::move(e)) {}
  ExprPtr expr;
};

struct IfStmt : Stmt {
  explicit IfStmt(int l) : Stmt(Kind::If, l) {}
  std::vector<std::pair<ExprPtr, Body>> branches;  // if and elifs
  Body else_body;
};

struct ForStmt : Stmt {
  explicit ForStmt(int l) : Stmt(Kind::For, l) {}
  Target target;
  ExprPtr iter;
  ExprPtr filter;  // for x in xs if filter
  bool recursive = false;
  Body body;
  Body else_body;
};

struct SetStmt : Stmt {
  explicit SetStmt(int l) : Stmt(Kind::Set, l) {}
  Target target;
  ExprPtr value;
};

// {% set x | filters %}body{% endset %}
struct SetBlockStmt : Stmt {
  explicit SetBlockStmt(int l) : Stmt(Kind::SetBlock, l) {}
  Target target;
  ExprPtr filter;  // FilterExpr chain with a null innermost input, or null
  Body body;
};

// A macro's parameters, and which of the special names its body reads:
// extra positional arguments are an error unless it reads `varargs`, extra
// keyword arguments unless it reads `kwargs`, a call block unless `caller`.
struct MacroSignature {
  std::vector<MacroParam> params;
  bool catch_varargs = false;
  bool catch_kwargs = false;
  bool catch_caller = false;
};

struct MacroStmt : Stmt {
  explicit MacroStmt(int l) : Stmt(Kind::Macro, l) {}
  std::string name;
  MacroSignature signature;
  Body body;
};

// {% call(params) macro(args) %}body{% endcall %}
struct CallBlockStmt : Stmt {
  explicit CallBlockStmt(int l) : Stmt(Kind::CallBlock, l) {}
  ExprPtr call;  // a CallExpr
  MacroSignature signature;  // of the caller() the body becomes
  Body body;
};

struct FilterBlockStmt : Stmt {
  explicit FilterBlockStmt(int l) : Stmt(Kind::FilterBlock, l) {}
  ExprPtr filter;
  Body body;
};

struct WithStmt : Stmt {
  explicit WithStmt(int l) : Stmt(Kind::With, l) {}
  std::vector<std::pair<Target, ExprPtr>> assignments;
  Body body;
};

// A block that just renders its body: transformers' {% generation %}.
struct BlockStmt : Stmt {
  explicit BlockStmt(int l) : Stmt(Kind::Block, l) {}
  Body body;
};

struct Template {
  Body body;
};

}  // namespace m40::chat::jinja
