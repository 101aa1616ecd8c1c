#include "store/huggingface.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <set>
#include <sstream>

#include "common/error.h"
#include "gguf/split_name.h"
#include "store/http_download.h"
#include "store/model_name.h"
#include "store/sha256.h"

namespace m40::store {

namespace {

std::string upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return s;
}

std::string base_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool is_model_gguf(const std::string& path) {
  const std::string name = upper(base_name(path));
  return name.size() > 5 && name.ends_with(".GGUF") && !name.starts_with("MMPROJ");
}

bool is_split_part(const std::string& path) { return gguf::parse_split_file_name(path).has_value(); }

std::string url_escape_path(const std::string& path) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : path) {
    if (std::isalnum(c) || c == '/' || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// Whether a Link entry's parameters ("; rel=\"next last\"") name "next"
// among its relation types.
bool has_next_relation(const std::string& params) {
  std::string p;
  for (unsigned char c : params) p += static_cast<char>(std::tolower(c));
  size_t rel = p.find("rel=");
  if (rel == std::string::npos) return false;
  rel += 4;
  const bool quoted = rel < p.size() && p[rel] == '"';
  if (quoted) ++rel;
  const size_t end = p.find_first_of(quoted ? "\"" : ";, ", rel);
  std::istringstream types(p.substr(rel, end == std::string::npos ? std::string::npos : end - rel));
  for (std::string type; types >> type;) {
    if (type == "next") return true;
  }
  return false;
}

}  // namespace

std::string hf_endpoint() {
  std::string endpoint = "https://huggingface.co";
  if (const char* env = std::getenv("M40_LLM_HF_ENDPOINT"); env != nullptr && *env != '\0') endpoint = env;
  while (endpoint.ends_with('/')) endpoint.pop_back();
  return endpoint;
}

std::map<std::string, std::string> hf_headers() {
  std::map<std::string, std::string> headers;
  if (const char* token = std::getenv("HF_TOKEN"); token != nullptr && *token != '\0') {
    headers["Authorization"] = std::string("Bearer ") + token;
  }
  return headers;
}

std::vector<HfFile> parse_hf_tree(const std::string& json) {
  std::vector<HfFile> files;
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(json);
  } catch (const std::exception& e) {
    throw Error(std::string("the Hugging Face file listing is not valid JSON: ") + e.what());
  }
  if (!doc.is_array()) throw Error("the Hugging Face file listing is not a JSON array");
  for (const auto& entry : doc) {
    if (!entry.is_object() || entry.value("type", "") != "file" || !entry.contains("path")) continue;
    HfFile f;
    f.path = entry["path"].get<std::string>();
    if (entry.contains("size") && entry["size"].is_number_unsigned()) f.size = entry["size"].get<uint64_t>();
    if (entry.contains("lfs") && entry["lfs"].is_object()) {
      const auto& lfs = entry["lfs"];
      if (lfs.contains("oid") && lfs["oid"].is_string()) {
        std::string oid = lfs["oid"].get<std::string>();
        if (oid.starts_with("sha256:")) oid.erase(0, 7);
        if (is_sha256_hex(oid)) f.sha256 = oid;
      }
      if (lfs.contains("size") && lfs["size"].is_number_unsigned()) f.size = lfs["size"].get<uint64_t>();
    }
    files.push_back(std::move(f));
  }
  return files;
}

std::optional<std::string> next_page_url(const std::string& link_header, const std::string& request_url) {
  // Entries are "<URL>; param=value; ..." separated by commas; a URL may
  // itself hold commas, so each entry is found from its angle brackets.
  size_t pos = 0;
  while ((pos = link_header.find('<', pos)) != std::string::npos) {
    const size_t close = link_header.find('>', pos);
    if (close == std::string::npos) break;
    const std::string target = link_header.substr(pos + 1, close - pos - 1);
    const size_t params_end = std::min(link_header.find('<', close), link_header.size());
    if (has_next_relation(link_header.substr(close + 1, params_end - close - 1))) {
      if (target.starts_with("http://") || target.starts_with("https://")) return target;
      const size_t scheme = request_url.find("://");
      const size_t origin_end = request_url.find('/', scheme == std::string::npos ? 0 : scheme + 3);
      return request_url.substr(0, origin_end) + (target.starts_with("/") ? "" : "/") + target;
    }
    pos = close + 1;
  }
  return std::nullopt;
}

std::vector<HfFile> hf_list_files(const std::string& org, const std::string& repo, const RequestPolicy& policy) {
  // A guard against a server whose pages point in a circle.
  constexpr int kMaxPages = 10000;
  std::string url = hf_endpoint() + "/api/models/" + org + "/" + repo + "/tree/main?recursive=true";
  std::vector<HfFile> files;
  std::set<std::string> seen;
  try {
    for (int page = 0; page < kMaxPages && seen.insert(url).second; ++page) {
      std::string link;
      auto page_files = parse_hf_tree(http_get_text(url, hf_headers(), &link, policy));
      files.insert(files.end(), std::make_move_iterator(page_files.begin()), std::make_move_iterator(page_files.end()));
      const auto next = next_page_url(link, url);
      if (!next) return files;
      url = *next;
    }
  } catch (const HttpStatusError& e) {
    if (e.status() == 404) throw Error("repository " + org + "/" + repo + " not found on " + hf_endpoint() + " (HTTP 404)");
    throw;
  }
  throw Error("the file listing of " + org + "/" + repo + " on " + hf_endpoint() + " does not end (its pages repeat)");
}

std::string hf_file_url(const std::string& org, const std::string& repo, const std::string& path) {
  return hf_endpoint() + "/" + org + "/" + repo + "/resolve/main/" + url_escape_path(path);
}

HfFile select_gguf(const std::vector<HfFile>& files, const std::string& quant, const std::string& repo_label) {
  std::vector<const HfFile*> ggufs;
  for (const auto& f : files) {
    if (is_model_gguf(f.path)) ggufs.push_back(&f);
  }
  if (ggufs.empty()) throw Error(repo_label + " holds no GGUF file");
  if (quant.empty() && ggufs.size() == 1) return *ggufs.front();
  const std::string want = upper(quant.empty() ? std::string(kDefaultQuant) : quant);

  const auto pick = [&](auto matches) -> const HfFile* {
    std::vector<const HfFile*> found;
    for (const HfFile* f : ggufs) {
      if (matches(*f)) found.push_back(f);
    }
    if (found.empty()) return nullptr;
    // One file rather than the parts of a split one; then the shortest path
    // (the repository's main copy rather than one in a subfolder).
    std::stable_sort(found.begin(), found.end(), [](const HfFile* a, const HfFile* b) {
      return std::make_pair(is_split_part(a->path), a->path.size()) < std::make_pair(is_split_part(b->path), b->path.size());
    });
    return found.front();
  };
  const HfFile* chosen = pick([&](const HfFile& f) { return quant_from_file_name(base_name(f.path)) == want; });
  if (chosen == nullptr) chosen = pick([&](const HfFile& f) { return upper(base_name(f.path)).find(want) != std::string::npos; });
  if (chosen != nullptr) return *chosen;

  std::set<std::string> available;
  for (const HfFile* f : ggufs) {
    const std::string q = quant_from_file_name(base_name(f->path));
    available.insert(q.empty() ? base_name(f->path) : q);
  }
  std::string list;
  for (const auto& q : available) list += (list.empty() ? "" : ", ") + q;
  throw Error("no " + want + " GGUF file in " + repo_label + "; it has: " + list);
}

std::vector<HfFile> model_files(const std::vector<HfFile>& files, const HfFile& chosen, const std::string& repo_label) {
  const auto split = gguf::parse_split_file_name(chosen.path);
  if (!split) return {chosen};
  std::vector<HfFile> parts;
  for (uint32_t number = 1; number <= split->count; ++number) {
    const auto it = std::find_if(files.begin(), files.end(), [&](const HfFile& f) {
      const auto part = gguf::parse_split_file_name(f.path);
      return part && part->prefix == split->prefix && part->count == split->count && part->number == number;
    });
    if (it == files.end()) {
      throw Error("the model " + base_name(chosen.path) + " in " + repo_label + " is split into " +
                  std::to_string(split->count) + " files, but part " + std::to_string(number) + " of " +
                  std::to_string(split->count) + " (" + gguf::split_file_name(split->prefix, number, split->count) + ") is not there");
    }
    parts.push_back(*it);
  }
  return parts;
}

}  // namespace m40::store
