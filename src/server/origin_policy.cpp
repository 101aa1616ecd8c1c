#include "server/origin_policy.h"

#include <algorithm>
#include <cctype>

namespace m40::server {

namespace {

char lower(char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }

// `pattern` against `text`, case-insensitively; '*' matches any run of characters.
bool glob_match(std::string_view pattern, std::string_view text) {
  size_t p = 0, t = 0, star = std::string_view::npos, resume = 0;
  while (t < text.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = t;
    } else if (p < pattern.size() && lower(pattern[p]) == lower(text[t])) {
      ++p;
      ++t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

// What Ollama allows without OLLAMA_ORIGINS: local pages and app shells.
std::vector<std::string> default_patterns() {
  std::vector<std::string> out;
  for (const char* host : {"localhost", "127.0.0.1", "[::1]"}) {
    for (const char* scheme : {"http://", "https://"}) {
      out.push_back(std::string(scheme) + host);
      out.push_back(std::string(scheme) + host + ":*");
    }
  }
  for (const char* scheme : {"app://*", "file://*", "tauri://*"}) out.emplace_back(scheme);
  return out;
}

// The header names a preflight asks for, if they are plain tokens.
std::string requested_headers(const std::string& list) {
  std::string out;
  for (const auto& name : OriginPolicy::parse_list(list)) {
    const bool token = std::all_of(name.begin(), name.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
    });
    if (token) out += ", " + name;
  }
  return out;
}

}  // namespace

OriginPolicy::OriginPolicy(std::vector<std::string> extra) : patterns_(default_patterns()) {
  for (auto& p : extra) {
    if (!p.empty()) patterns_.push_back(std::move(p));
  }
}

std::vector<std::string> OriginPolicy::parse_list(std::string_view text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view item = text.substr(start, end - start);
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.front()))) item.remove_prefix(1);
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.back()))) item.remove_suffix(1);
    if (!item.empty()) out.emplace_back(item);
    start = end + 1;
  }
  return out;
}

bool OriginPolicy::allows(std::string_view origin) const {
  for (const auto& p : patterns_) {
    if (glob_match(p, origin)) return true;
  }
  return false;
}

HttpResponse OriginPolicy::preflight(const HttpRequest& req) const {
  HttpResponse res;
  res.status = 204;
  allow_reading(res, req.header("Origin"));
  res.set_header("Access-Control-Allow-Methods", "GET, POST, PUT, DELETE, HEAD, OPTIONS");
  res.set_header("Access-Control-Allow-Headers",
                 "Authorization, Content-Type, Accept, User-Agent, X-Requested-With, X-Api-Key" +
                     requested_headers(req.header("Access-Control-Request-Headers")));
  res.set_header("Access-Control-Max-Age", "86400");
  return res;
}

void OriginPolicy::allow_reading(HttpResponse& res, const std::string& origin) {
  res.set_header("Access-Control-Allow-Origin", origin);
  res.set_header("Vary", "Origin");
}

bool is_loopback_address(std::string_view host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.starts_with("127.");
}

bool host_allowed(std::string_view host_header, std::string_view bound_host) {
  if (host_header.empty()) return true;
  std::string_view name = host_header;
  if (name.front() == '[') {
    const size_t close = name.find(']');
    if (close == std::string_view::npos) return false;
    name = name.substr(0, close + 1);
  } else if (const size_t colon = name.rfind(':'); colon != std::string_view::npos) {
    name = name.substr(0, colon);
  }
  std::string bracketed(bound_host);  // an IPv6 address is written [::1] in Host
  if (bound_host.find(':') != std::string_view::npos && !bound_host.starts_with("[")) {
    bracketed.insert(bracketed.begin(), '[');
    bracketed.push_back(']');
  }
  for (std::string_view ok : {std::string_view("localhost"), std::string_view("127.0.0.1"), std::string_view("[::1]"),
                              std::string_view(bracketed)}) {
    if (iequals(ok, name)) return true;
  }
  return false;
}

}  // namespace m40::server
