#include "store/model_ref.h"

#include <filesystem>
#include <optional>

#include "common/error.h"
#include "store/model_name.h"
#include "store/pull.h"
#include "store/store.h"

namespace m40::store {

namespace fs = std::filesystem;

namespace {

// What to tell someone whose `ref` is neither a file nor a stored model: the
// pull command after which the same command works. parse_pull_ref says what
// `m40-llm pull REF` would fetch and under which name it would store it, so
// this and `pull` cannot disagree.
std::string missing_model_message(const std::string& ref, bool local_files = true) {
  const std::string not_found = "model '" + ref + "' not found: ";
  std::optional<PullRef> pull;
  try {
    pull = parse_pull_ref(ref, local_files);
  } catch (const Error&) {
    // Not something `pull` takes as it is.
  }
  if (!pull) {
    if (is_gguf_file_name(ref)) return "model file '" + ref + "' does not exist";
    const auto name = try_parse_model_name(ref);
    if (!name) {
      try {
        parse_model_name(ref);
      } catch (const Error& e) {
        return "no file or stored model '" + ref + "': " + e.what();
      }
    }
    // A valid name no source is spelled like ("a/b/c"): a model can still
    // be stored under it.
    return not_found + "pull one under that name with m40-llm pull SOURCE --name " + ref;
  }
  const auto name = try_parse_model_name(ref);
  if (!name || !(*name == pull->default_name)) {
    // "library/qwen3", "ORG/REPO/FILE.gguf", a URL: pull stores it under
    // another name, which is the one to use afterwards.
    const std::string stored = pull->default_name.str();
    return not_found + "m40-llm pull " + ref + " stores it as " + stored + ", then use " + stored;
  }
  std::string message = not_found + "pull it with m40-llm pull " + ref;
  if (pull->kind == SourceKind::OllamaLibrary && pull->ollama.space != "library") {
    // ORG/REPO is a user's model in the Ollama library, and just as often
    // meant as a Hugging Face repository, which is pulled (and named) with
    // the hf.co/ prefix.
    message += " (from the Ollama library), or for the Hugging Face repository m40-llm pull hf.co/" + ref +
               " and use hf.co/" + ref;
  }
  return message;
}

}  // namespace

std::string resolve_model(const std::string& ref) {
  std::error_code ec;
  if (!ref.empty() && fs::is_regular_file(ref, ec)) return ref;
  // Only a file path wins over a store name: a folder that happens to have
  // a model's name (./tinystories) does not hide the model.
  const bool is_directory = fs::is_directory(ref, ec);
  if (!is_directory && (ref.starts_with('/') || ref.starts_with("./") || ref.starts_with("../"))) {
    throw Error("model file '" + ref + "' does not exist");
  }
  if (auto name = try_parse_model_name(ref)) {
    const Store store = Store::from_environment();
    if (auto m = store.find(*name)) return m->gguf_path.string();
  }
  if (is_directory) throw Error("'" + ref + "' is a directory, not a GGUF model file");
  throw Error(missing_model_message(ref));
}

std::string resolve_stored_model(const std::string& ref) {
  if (auto name = try_parse_model_name(ref)) {
    const Store store = Store::from_environment();
    if (auto m = store.find(*name)) return m->gguf_path.string();
  }
  throw Error(missing_model_message(ref, false));
}

}  // namespace m40::store
