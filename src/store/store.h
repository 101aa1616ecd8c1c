// The model store under $M40_LLM_HOME (default ~/.m40-llm):
//
//   models/<name>/<tag>/model.gguf           the model, complete and verified
//   models/<name>/<tag>/manifest.json        what it is and where it came from
//   models/<name>/<tag>/model.gguf.partial   a download in progress (never listed)
//   models/<name>/<tag>/model.gguf.partial.json  what the partial file is (http_download.h)
//
// A model exists when its manifest exists; the manifest is written last, by
// rename, after the GGUF file has been checked and moved into place.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "store/model_name.h"

namespace m40::store {

// The text layers an Ollama library model comes with, kept in its manifest as
// the registry gave them. Kept, not used: Ollama's template is a Go template,
// which the Jinja chat engine cannot read, so `run` and `serve` use the GGUF's
// own chat template (or the documented fallback) as for any other model.
struct OllamaExtras {
  std::string template_text;          // application/vnd.ollama.image.template
  std::string system;                 // ...image.system: a default system message
  std::string params;                 // ...image.params: JSON text (stop, temperature, ...)
  std::vector<std::string> licenses;  // ...image.license, one per layer

  bool operator==(const OllamaExtras&) const = default;
};

struct Manifest {
  std::string name;
  std::string tag;
  std::string source;      // URL or local path it was pulled from
  uint64_t size = 0;       // bytes of model.gguf
  std::string sha256;      // lower-case hex
  std::string pulled_at;   // ISO 8601 UTC, "2026-11-21T06:50:00Z"
  std::optional<uint32_t> file_type;  // general.file_type
  std::string quant;       // its name ("Q8_0"), or the dominant tensor type
  std::string architecture;
  std::optional<OllamaExtras> ollama;  // pulled from the Ollama library

  std::filesystem::path gguf_path;  // not stored: where model.gguf lies

  ModelName model_name() const { return {name, tag}; }
};

class Store {
 public:
  explicit Store(std::filesystem::path home);
  // $M40_LLM_HOME, else $HOME/.m40-llm.
  static Store from_environment();
  static std::filesystem::path default_home();

  const std::filesystem::path& home() const { return home_; }
  std::filesystem::path models_dir() const { return home_ / "models"; }
  std::filesystem::path model_dir(const ModelName& name) const;
  std::filesystem::path gguf_path(const ModelName& name) const { return model_dir(name) / "model.gguf"; }
  std::filesystem::path manifest_path(const ModelName& name) const { return model_dir(name) / "manifest.json"; }
  std::filesystem::path partial_path(const ModelName& name) const { return model_dir(name) / "model.gguf.partial"; }

  std::optional<Manifest> find(const ModelName& name) const;
  // Every model, sorted by name and tag; unreadable manifests are skipped.
  std::vector<Manifest> list() const;
  enum class Removed {
    Model,               // a model (and any partial download beside it)
    UnfinishedDownload,  // only a partial download, which never became a model
  };
  // Removes a model (file, manifest, any partial download) or what an
  // unfinished pull left. Throws m40::Error when there is neither, and
  // BusyError while a pull of the name holds the partial file's lock.
  Removed remove(const ModelName& name) const;

  // Moves a verified GGUF file (which must lie in model_dir(name)) to
  // model.gguf and writes the manifest (name, tag, gguf facts filled here).
  Manifest install(const ModelName& name, const std::filesystem::path& verified_file, Manifest manifest) const;

 private:
  std::filesystem::path home_;
};

// Fills file_type, quant and architecture from a GGUF file's header;
// throws m40::FormatError when it is not a valid GGUF file.
void describe_gguf(const std::filesystem::path& path, Manifest& manifest);

std::string now_iso8601();
// "2 minutes ago", "3 days ago", relative to `now` (seconds since the epoch).
std::string relative_time(const std::string& iso8601, int64_t now);
// "750 KB", "4.7 GB" (decimal units, as Ollama prints them).
std::string human_size(uint64_t bytes);

}  // namespace m40::store
