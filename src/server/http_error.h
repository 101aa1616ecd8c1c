// An error answered to the client: HTTP status, message, and OpenAI's
// error type / code. Route handlers throw it; route() answers it in the
// route's API shape.
#pragma once

#include <string>
#include <utility>

namespace m40::server {

struct HttpError {
  HttpError(int status_, std::string message_, std::string type_ = "invalid_request_error", std::string code_ = "")
      : status(status_), message(std::move(message_)), type(std::move(type_)), code(std::move(code_)) {}
  int status;
  std::string message;
  std::string type;
  std::string code;
};

}  // namespace m40::server
