#include "server/model_catalog.h"

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <set>

#include "store/store.h"

namespace m40::server {

namespace fs = std::filesystem;

namespace {

std::chrono::system_clock::time_point parse_iso8601(const std::string& text) {
  std::tm tm{};
  if (strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &tm) == nullptr) return {};
  return std::chrono::system_clock::from_time_t(timegm(&tm));
}

std::string canonical_path(const fs::path& path) {
  std::error_code ec;
  auto p = fs::weakly_canonical(path, ec);
  return ec ? path.string() : p.string();
}

}  // namespace

std::vector<AvailableModel> available_models(const ModelManager& models) {
  std::vector<AvailableModel> out;
  std::set<std::string> paths;
  for (const auto& m : store::Store::from_environment().list()) {
    AvailableModel a{m.name + ":" + m.tag, canonical_path(m.gguf_path), m.size, parse_iso8601(m.pulled_at), m.sha256,
                     m.architecture, m.quant};
    if (paths.insert(a.path).second) out.push_back(std::move(a));
  }
  auto add_file = [&](const std::string& name, const std::string& path) {
    if (!paths.insert(path).second) return;
    std::error_code ec;
    AvailableModel a{name, path, fs::file_size(path, ec), {}, "", "", ""};
    const auto mtime = fs::last_write_time(path, ec);
    if (!ec) {
      a.modified = std::chrono::time_point_cast<std::chrono::system_clock::duration>(std::chrono::file_clock::to_sys(mtime));
    }
    out.push_back(std::move(a));
  };
  if (auto d = models.default_model()) add_file(d->name, d->path);
  if (auto r = models.resident()) add_file(r->model->name, r->model->path);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return out;
}

std::string ollama_name(const std::string& name) {
  return name.find(':') == std::string::npos ? name + ":latest" : name;
}

}  // namespace m40::server
