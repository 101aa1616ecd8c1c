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
#include <memory>
#include <optional>
#include <set>

#include "common/error.h"
#include "gguf/file.h"
#include "gguf/split_name.h"
#include "model/model_summary.h"
#include "store/http_download.h"
#include "store/sha256.h"

namespace m40::store {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

// "model-00002-of-00003.gguf": what Store::part_file_name makes.
bool is_part_file_name(const std::string& file) {
  const auto split = gguf::parse_split_file_name(file);
  return split && split->prefix == "model";
}

// The files a pull leaves in a model's folder besides the manifest: the
// model, its parts, and what an unfinished or interrupted pull left (partial
// files, their records, the names a split model is checked under). Nothing
// else is ever there, so `rm` removes exactly these.
bool is_pull_file_name(const std::string& file) {
  return file == "model.gguf" || file.ends_with(".partial") || file.ends_with(".partial.json") ||
         file == "manifest.json.tmp" || gguf::parse_split_file_name(file).has_value();
}

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
  if (!m.parts.empty()) {
    Json parts = Json::array();
    for (const auto& p : m.parts) parts.push_back({{"file", p.file}, {"size", p.size}, {"sha256", p.sha256}});
    j["parts"] = parts;
  }
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
  if (j.contains("parts")) {
    for (const auto& p : j.at("parts")) {
      ManifestPart part{p.at("file").get<std::string>(), p.at("size").get<uint64_t>(), p.at("sha256").get<std::string>()};
      // Only the store's own names: a manifest never points outside its folder.
      if (!is_part_file_name(part.file)) throw Error("not a part's file name: " + part.file);
      m.parts.push_back(std::move(part));
    }
  }
  return m;
}

std::optional<Manifest> read_manifest(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  try {
    Manifest m = from_json(Json::parse(in));
    m.gguf_path = path.parent_path() / (m.parts.empty() ? std::string("model.gguf") : m.parts.front().file);
    return m;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::string system_message(const std::error_code& ec) { return ec.message(); }

bool all_files_exist(const Manifest& m) {
  std::error_code ec;
  for (const auto& f : m.files()) {
    if (!fs::is_regular_file(f, ec)) return false;
  }
  return true;
}

// The regular files of `dir` whose names `keep` accepts (none when it cannot be read).
template <typename Pred>
std::vector<fs::path> files_in(const fs::path& dir, Pred keep) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::error_code type_ec;
    if (it->is_regular_file(type_ec) && keep(it->path().filename().string())) out.push_back(it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::vector<fs::path> Manifest::files() const {
  if (parts.empty()) return {gguf_path};
  std::vector<fs::path> out;
  for (const auto& p : parts) out.push_back(gguf_path.parent_path() / p.file);
  return out;
}

std::string split_sha256(const std::vector<std::string>& part_sha256s) {
  Sha256 hash;
  for (const auto& sha : part_sha256s) {
    const std::string line = sha + "\n";
    hash.update(line.data(), line.size());
  }
  return hash.hex_digest();
}

std::string Store::part_file_name(uint32_t number, uint32_t count) { return gguf::split_file_name("model", number, count); }

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
  if (!m || !all_files_exist(*m)) return std::nullopt;
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
    if (!m || !all_files_exist(*m)) continue;
    out.push_back(std::move(*m));
  }
  std::sort(out.begin(), out.end(), [](const Manifest& a, const Manifest& b) {
    return std::tie(a.name, a.tag) < std::tie(b.name, b.tag);
  });
  return out;
}

Store::Removed Store::remove(const ModelName& name) const {
  std::error_code ec;
  const fs::path dir = model_dir(name);
  const bool is_model = fs::exists(manifest_path(name), ec);
  // A pull that never finished leaves only partial files and their records
  // (a split model's: one of each per part).
  const auto partials = files_in(dir, [](const std::string& f) { return f.ends_with(".partial"); });
  const bool has_partial =
      !partials.empty() || !files_in(dir, [](const std::string& f) { return f.ends_with(".partial.json"); }).empty();
  if (!is_model && !has_partial) throw Error("model '" + name.str() + "' not found");
  // A pull holds its partial files' locks until its model is in place:
  // holding them here keeps the files of a pull in progress out of reach.
  std::vector<std::unique_ptr<LockedPartial>> locks;
  for (const auto& partial : partials) {
    try {
      locks.push_back(std::make_unique<LockedPartial>(partial));
    } catch (const BusyError&) {
      throw BusyError("cannot remove '" + name.str() + "': a pull of it is running (it is writing " + partial.string() +
                      "); wait for it to finish, or stop it, then remove it");
    }
  }
  // The manifest goes first: a model without one is not a model, whatever
  // happens to the rest. Then every file a pull of the name leaves: the
  // model, all its parts, partial files and their records.
  std::vector<fs::path> doomed{manifest_path(name)};
  const auto rest = files_in(dir, is_pull_file_name);
  doomed.insert(doomed.end(), rest.begin(), rest.end());
  for (const auto& p : doomed) {
    if (!fs::remove(p, ec) && ec) throw Error("cannot remove " + p.string() + ": " + system_message(ec));
  }
  // Empty folders up to models/ go too, so `list` and the tree stay tidy.
  fs::path up = dir;
  while (up != models_dir() && up.has_parent_path()) {
    if (!fs::is_empty(up, ec) || ec) break;
    fs::remove(up, ec);
    if (ec) break;
    up = up.parent_path();
  }
  return is_model ? Removed::Model : Removed::UnfinishedDownload;
}

Manifest Store::install(const ModelName& name, const fs::path& verified_file, Manifest manifest) const {
  manifest.parts.clear();
  return install(name, std::vector<fs::path>{verified_file}, std::move(manifest));
}

Manifest Store::install(const ModelName& name, const std::vector<fs::path>& verified_files, Manifest manifest) const {
  const bool split = !manifest.parts.empty();
  if (split ? verified_files.size() != manifest.parts.size() : verified_files.size() != 1) {
    throw Error("cannot install " + name.str() + ": " + std::to_string(verified_files.size()) + " files for " +
                std::to_string(std::max<size_t>(1, manifest.parts.size())) + " in its manifest");
  }
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
  std::vector<fs::path> targets;
  for (size_t i = 0; i < verified_files.size(); ++i) {
    targets.push_back(split ? model_dir(name) / manifest.parts[i].file : gguf_path(name));
  }
  std::error_code ec;
  for (size_t i = 0; i < verified_files.size() && !ec; ++i) fs::rename(verified_files[i], targets[i], ec);
  if (!ec) fs::rename(tmp, manifest_path(name), ec);
  if (ec) {
    fs::remove(tmp);
    throw Error("cannot move the model into " + model_dir(name).string() + ": " + system_message(ec));
  }
  // What an earlier model of the name had and this one has not: a single
  // file replaced by parts, parts by a single file or by another count.
  const std::set<fs::path> used(targets.begin(), targets.end());
  const auto model_files =
      files_in(model_dir(name), [](const std::string& f) { return f == "model.gguf" || is_part_file_name(f); });
  for (const auto& old : model_files) {
    if (used.count(old) == 0) fs::remove(old, ec);
  }
  manifest.gguf_path = targets.front();
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
