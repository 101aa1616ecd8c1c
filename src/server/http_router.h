// The server's routes: method and path (or a pattern whose groups become
// the request's params) to a handler. HEAD finds the GET route.
#pragma once

#include <functional>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "server/http_message.h"

namespace m40::server {

class HttpRouter {
 public:
  using Handler = std::function<void(const HttpRequest&, HttpResponse&)>;

  struct Route {
    std::string method;
    std::string path;                // exact path, when there is no pattern
    std::optional<std::regex> pattern;
    Handler handler;
    bool answers_at_once = false;    // never waits: may run on the transport's I/O thread
  };

  // `path`: an exact path, or an ECMAScript pattern with groups ("/v1/models/(.+)").
  void get(const std::string& path, Handler handler, bool answers_at_once = false);
  void post(const std::string& path, Handler handler);

  // The route for a request, its params filled in; null when none matches.
  const Route* find(const std::string& method, const std::string& path, std::vector<std::string>* params = nullptr) const;

 private:
  void add(std::string method, const std::string& path, Handler handler, bool answers_at_once);
  std::vector<Route> routes_;
};

}  // namespace m40::server
