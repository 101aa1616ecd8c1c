// Errors of chat-template parsing and rendering. All are m40::Error, so the
// CLI and the server report them as one line.
#pragma once

#include <string>

#include "common/error.h"

namespace m40::chat {

class TemplateError : public Error {
 public:
  TemplateError(const std::string& what, int line, int column) : Error(what), line_(line), column_(column) {}
  int line() const { return line_; }      // 1-based; 0 when unknown
  int column() const { return column_; }  // 1-based, in characters; 0 when unknown

 private:
  int line_;
  int column_;
};

// The template text is not valid Jinja (or uses a tag m40-llm does not run).
// what(): "chat template syntax error at line L, column C: MESSAGE".
class TemplateSyntaxError : public TemplateError {
 public:
  TemplateSyntaxError(const std::string& message, int line, int column)
      : TemplateError("chat template syntax error at line " + std::to_string(line) + ", column " +
                          std::to_string(column) + ": " + message,
                      line, column),
        message_(message) {}
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

// Rendering failed the way Python would fail (a type error, an undefined
// value used where Jinja2 raises, ...).
// what(): "chat template error at line L: MESSAGE".
class TemplateRenderError : public TemplateError {
 public:
  TemplateRenderError(const std::string& message, int line)
      : TemplateError("chat template error at line " + std::to_string(line) + ": " + message, line, 0),
        message_(message) {}
  const std::string& message() const { return message_; }

 protected:
  // For subclasses that want their own what().
  TemplateRenderError(const std::string& what, const std::string& message, int line)
      : TemplateError(what, line, 0), message_(message) {}

 private:
  std::string message_;
};

// The template called raise_exception(message): what() and message() are the
// message verbatim (it is meant for the user, as transformers shows it).
class TemplateRaisedError : public TemplateRenderError {
 public:
  TemplateRaisedError(const std::string& message, int line) : TemplateRenderError(message, message, line) {}
};

// The render hit one of its bounds (output size, step budget, recursion).
class TemplateLimitError : public TemplateRenderError {
 public:
  using TemplateRenderError::TemplateRenderError;
};

}  // namespace m40::chat
