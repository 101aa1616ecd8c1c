#include "server/http_router.h"

namespace m40::server {

void HttpRouter::add(std::string method, const std::string& path, Handler handler, bool answers_at_once) {
  Route r;
  r.method = std::move(method);
  if (path.find('(') != std::string::npos) {
    r.pattern.emplace(path);
  } else {
    r.path = path;
  }
  r.handler = std::move(handler);
  r.answers_at_once = answers_at_once;
  routes_.push_back(std::move(r));
}

void HttpRouter::get(const std::string& path, Handler handler, bool answers_at_once) {
  add("GET", path, std::move(handler), answers_at_once);
}

void HttpRouter::post(const std::string& path, Handler handler) { add("POST", path, std::move(handler), false); }

const HttpRouter::Route* HttpRouter::find(const std::string& method, const std::string& path,
                                          std::vector<std::string>* params) const {
  const std::string& m = method == "HEAD" ? std::string("GET") : method;
  for (const auto& r : routes_) {
    if (r.method != m) continue;
    if (!r.pattern) {
      if (r.path == path) return &r;
      continue;
    }
    std::smatch match;
    if (std::regex_match(path, match, *r.pattern)) {
      if (params != nullptr) {
        params->clear();
        for (size_t i = 1; i < match.size(); ++i) params->push_back(match[i].str());
      }
      return &r;
    }
  }
  return nullptr;
}

}  // namespace m40::server
