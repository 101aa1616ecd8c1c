#include "store/store.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <optional>

#include "common/error.h"
#include "gguf/file.h"
#include "model/model_summary.h"
#include "store/http_download.h"

namespace m40::store {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

Json to_json(const Manifest& m) {
  Json j;
  j["name"] = m.name;
  j["tag"] = m.tag;
  j["source"] = m.source;
  j["size"] = m.size;
  j["sha256"] = m.sha256;
  j["pulled_at"] = m.pulled_at;
  if (m.file_type) j["file_type"] = *m.file_type;
  j["quant"] = m.quant;
  j["architecture"] = m.architecture;
  if (m.ollama) {
    Json o = Json::object();
    if (!m.ollama->template_text.empty()) o["template"] = m.ollama->template_text;
    if (!m.ollama->system.empty()) o["system"] = m.ollama->system;
    if (!m.ollama->params.empty()) {
      // Kept as JSON when it is (it always is from the registry), so that
      // the manifest reads naturally; as text otherwise.
      Json params = Json::parse(m.ollama->params, nullptr, false);
      o["params"] = params.is_discarded() ? Json(m.ollama->params) : params;
    }
    if (!m.ollama->licenses.empty()) o["license"] = m.ollama->licenses;
    j["ollama"] = o;
  }
  return j;
}

OllamaExtras ollama_extras_from_json(const Json& o) {
  OllamaExtras x;
  x.template_text = o.value("template", "");
  x.system = o.value("system", "");
  if (o.contains("params")) x.params = o["params"].is_string() ? o["params"].get<std::string>() : o["params"].dump();
  if (o.contains("license") && o["license"].is_array()) {
    for (const auto& l : o["license"]) {
      if (l.is_string()) x.licenses.push_back(l.get<std::string>());
    }
  }
  return x;
}

Manifest from_json(const Json& j) {
  Manifest m;
  m.name = j.at("name").get<std::string>();
  m.tag = j.at("tag").get<std::string>();
  m.source = j.value("source", "");
  m.size = j.at("size").get<uint64_t>();
  m.sha256 = j.at("sha256").get<std::string>();
  m.pulled_at = j.value("pulled_at", "");
  if (j.contains("file_type") && j["file_type"].is_number_unsigned()) m.file_type = j["file_type"].get<uint32_t>();
  m.quant = j.value("quant", "");
  m.architecture = j.value("architecture", "");
  if (j.contains("ollama") && j["ollama"].is_object()) m.ollama = ollama_extras_from_json(j["ollama"]);
  return m;
}

std::optional<Manifest> read_manifest(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  try {
    Manifest m = from_json(Json::parse(in));
    m.gguf_path = path.parent_path() / "model.gguf";
    return m;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::string system_message(const std::error_code& ec) { return ec.message(); }

}  // namespace

Store::Store(fs::path home) : home_(std::move(home)) {}

fs::path Store::default_home() {
  if (const char* env = std::getenv("M40_LLM_HOME"); env != nullptr && *env != '\0') return env;
  const char* home = std::getenv("HOME");
  if (home == nullptr || *home == '\0') throw Error("cannot find the model store: set M40_LLM_HOME or HOME");
  return fs::path(home) / ".m40-llm";
}

Store Store::from_environment() { return Store(default_home()); }

fs::path Store::model_dir(const ModelName& name) const { return models_dir() / name.name / name.tag; }

std::optional<Manifest> Store::find(const ModelName& name) const {
  auto m = read_manifest(manifest_path(name));
  if (!m) return std::nullopt;
  std::error_code ec;
  if (!fs::is_regular_file(m->gguf_path, ec)) return std::nullopt;
  return m;
}

std::vector<Manifest> Store::list() const {
  std::vector<Manifest> out;
  std::error_code ec;
  if (!fs::is_directory(models_dir(), ec)) return out;
  for (auto it = fs::recursive_directory_iterator(models_dir(), fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->path().filename() != "manifest.json") continue;
    auto m = read_manifest(it->path());
    if (!m) continue;
    std::error_code exists_ec;
    if (!fs::is_regular_file(m->gguf_path, exists_ec)) continue;
    out.push_back(std::move(*m));
  }
  std::sort(out.begin(), out.end(), [](const Manifest& a, const Manifest& b) {
    return std::tie(a.name, a.tag) < std::tie(b.name, b.tag);
  });
  return out;
}

Store::Removed Store::remove(const ModelName& name) const {
  std::error_code ec;
  const fs::path partial = partial_path(name);
  const fs::path record = partial_record_path(partial);
  const bool is_model = fs::exists(manifest_path(name), ec);
  // A pull that never finished leaves only its partial file and record.
  const bool has_partial = fs::exists(partial, ec) || fs::exists(record, ec);
  if (!is_model && !has_partial) throw Error("model '" + name.str() + "' not found");
  // A pull holds the partial file's lock until its model is in place:
  // holding it here keeps the files of a pull in progress out of reach.
  std::optional<LockedPartial> lock;
  if (fs::exists(partial, ec)) {
    try {
      lock.emplace(partial);
    } catch (const BusyError&) {
      throw BusyError("cannot remove '" + name.str() + "': a pull of it is running (it is writing " + partial.string() +
                      "); wait for it to finish, or stop it, then remove it");
    }
  }
  // The manifest goes first: a model without one is not a model, whatever
  // happens to the rest.
  for (const auto& p : {manifest_path(name), gguf_path(name), partial, record}) {
    if (!fs::remove(p, ec) && ec) throw Error("cannot remove " + p.string() + ": " + system_message(ec));
  }
  // Empty folders up to models/ go too, so `list` and the tree stay tidy.
  fs::path dir = model_dir(name);
  while (dir != models_dir() && dir.has_parent_path()) {
    if (!fs::is_empty(dir, ec) || ec) break;
    fs::remove(dir, ec);
    if (ec) break;
    dir = dir.parent_path();
  }
  return is_model ? Removed::Model : Removed::UnfinishedDownload;
}

Manifest Store::install(const ModelName& name, const fs::path& verified_file, Manifest manifest) const {
  manifest.name = name.name;
  manifest.tag = name.tag;
  if (manifest.pulled_at.empty()) manifest.pulled_at = now_iso8601();
  const fs::path tmp = model_dir(name) / "manifest.json.tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << to_json(manifest).dump(2) << '\n';
    out.flush();
    if (!out) throw Error("cannot write " + tmp.string() + ": " + std::strerror(errno));
  }
  std::error_code ec;
  fs::rename(verified_file, gguf_path(name), ec);
  if (!ec) fs::rename(tmp, manifest_path(name), ec);
  if (ec) {
    fs::remove(tmp);
    throw Error("cannot move the model into " + model_dir(name).string() + ": " + system_message(ec));
  }
  manifest.gguf_path = gguf_path(name);
  return manifest;
}

void describe_gguf(const fs::path& path, Manifest& manifest) {
  const gguf::File file = gguf::File::open(path.string());
  const auto& md = file.metadata();
  manifest.architecture = md.get_or<std::string>("general.architecture", "");
  manifest.file_type = md.get_optional<uint32_t>("general.file_type");
  manifest.quant.clear();
  if (manifest.file_type) {
    // llama.cpp's names ("MOSTLY_Q4_K_M", "ALL_F32") as Ollama shows them.
    if (auto n = model::file_type_name(*manifest.file_type)) {
      manifest.quant = *n;
      for (const char* prefix : {"MOSTLY_", "ALL_"}) {
        if (manifest.quant.starts_with(prefix)) manifest.quant.erase(0, std::strlen(prefix));
      }
    }
  }
  if (manifest.quant.empty()) {
    // No (known) file type: name the tensor type holding the most bytes.
    std::map<std::string, uint64_t> bytes;
    for (const auto& t : file.tensors()) bytes[std::string(gguf::tensor_type_name(t.type))] += t.byte_size;
    uint64_t best = 0;
    for (const auto& [type, n] : bytes) {
      if (n > best) {
        best = n;
        manifest.quant = type;
      }
    }
  }
}

std::string now_iso8601() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string relative_time(const std::string& iso8601, int64_t now) {
  std::tm tm{};
  if (strptime(iso8601.c_str(), "%Y-%m-%dT%H:%M:%SZ", &tm) == nullptr) return "unknown";
  const int64_t then = static_cast<int64_t>(timegm(&tm));
  const int64_t s = std::max<int64_t>(0, now - then);
  const auto ago = [](int64_t n, const char* unit) {
    return std::to_string(n) + " " + unit + (n == 1 ? "" : "s") + " ago";
  };
  if (s < 1) return "less than a second ago";
  if (s < 60) return ago(s, "second");
  if (s < 3600) return ago(s / 60, "minute");
  if (s < 86400) return ago(s / 3600, "hour");
  if (s < 7 * 86400) return ago(s / 86400, "day");
  if (s < 30 * 86400) return ago(s / (7 * 86400), "week");
  if (s < 365 * 86400) return ago(s / (30 * 86400), "month");
  return ago(s / (365 * 86400), "year");
}

std::string human_size(uint64_t bytes) {
  constexpr const char* kUnits[] = {"B", "KB", "MB", "GB", "TB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (value >= 1000.0 && unit + 1 < std::size(kUnits)) {
    value /= 1000.0;
    ++unit;
  }
  char buf[32];
  if (unit == 0) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else if (value >= 100.0) std::snprintf(buf, sizeof buf, "%.0f %s", value, kUnits[unit]);
  else std::snprintf(buf, sizeof buf, "%.1f %s", value, kUnits[unit]);
  return buf;
}

}  // namespace m40::store
