#include "store/model_name.h"

#include <algorithm>
#include <cctype>
#include <regex>

#include "common/error.h"
#include "gguf/split_name.h"

namespace m40::store {

namespace {

bool allowed_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '.' || c == '_' || c == '-';
}

// The file names of a model's folder (models/NAME/TAG/): a name part or a
// tag spelled like one would be a folder where the store puts a file.
bool is_store_file_name(const std::string& part) {
  for (const char* reserved : {"model.gguf", "manifest.json", "manifest.json.tmp", "model.gguf.partial",
                               "model.gguf.partial.json"}) {
    if (part == reserved) return true;
  }
  // A split model's parts, their partial files and the names they are
  // checked under (store.h).
  std::string file = part;
  for (const char* suffix : {".partial.json", ".partial"}) {
    if (file.ends_with(suffix)) {
      file.resize(file.size() - std::string(suffix).size());
      break;
    }
  }
  const auto split = gguf::parse_split_file_name(file);
  return split && (split->prefix == "model" || split->prefix == "verifying");
}

// Empty when valid, else why not. `what`: "tag" or "name part".
std::string check_component(const std::string& part, const std::string& what) {
  if (part.empty()) return "an empty " + what;
  if (part == "." || part == "..") return "'" + part + "' as a " + what;
  if (part.size() > 128) return "a " + what + " longer than 128 characters";
  for (char c : part) {
    if (!allowed_char(c)) return std::string("the character '") + c + "' in a " + what + " (use letters, digits, '.', '_', '-')";
  }
  if (is_store_file_name(part)) return "'" + part + "' as a " + what + " (the store uses that file name)";
  return {};
}

std::optional<ModelName> parse(const std::string& text, std::string* why) {
  ModelName out;
  const size_t slash = text.rfind('/');
  const size_t colon = text.rfind(':');
  if (colon != std::string::npos && (slash == std::string::npos || colon > slash)) {
    out.name = text.substr(0, colon);
    out.tag = text.substr(colon + 1);
  } else {
    out.name = text;
    out.tag = kDefaultTag;
  }
  std::string problem = check_component(out.tag, "tag");
  size_t start = 0;
  while (problem.empty()) {
    const size_t end = out.name.find('/', start);
    problem = check_component(out.name.substr(start, end - start), "name part");
    if (end == std::string::npos) break;
    start = end + 1;
  }
  if (!problem.empty()) {
    if (why) *why = problem;
    return std::nullopt;
  }
  return out;
}

}  // namespace

ModelName parse_model_name(const std::string& text) {
  std::string why;
  auto name = parse(text, &why);
  if (!name) throw Error("invalid model name '" + text + "': " + why);
  return *name;
}

std::optional<ModelName> try_parse_model_name(const std::string& text) { return parse(text, nullptr); }

std::string sanitize_name_component(const std::string& text) {
  std::string out;
  for (char c : text) {
    out += allowed_char(c) ? static_cast<char>(std::tolower(static_cast<unsigned char>(c))) : '-';
  }
  while (!out.empty() && !std::isalnum(static_cast<unsigned char>(out.front()))) out.erase(0, 1);
  if (out.size() > 128) out.resize(128);
  if (out.empty() || is_store_file_name(out)) out = "model";
  return out;
}

bool is_gguf_file_name(const std::string& file_name) {
  if (file_name.size() < 5) return false;
  std::string tail = file_name.substr(file_name.size() - 5);
  std::transform(tail.begin(), tail.end(), tail.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return tail == ".gguf";
}

std::string quant_from_file_name(const std::string& file_name) {
  static const std::regex kQuant(R"((?:^|[-._])((?:I?Q[0-9](?:_[A-Z0-9]+)*)|BF16|F16|F32)(?=$|[-._]))",
                                 std::regex::icase);
  std::string stem = file_name;
  if (auto dot = stem.rfind('.'); dot != std::string::npos) stem.resize(dot);
  std::string found;
  for (auto it = std::sregex_iterator(stem.begin(), stem.end(), kQuant); it != std::sregex_iterator(); ++it) {
    found = (*it)[1].str();
  }
  std::transform(found.begin(), found.end(), found.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return found;
}

}  // namespace m40::store
