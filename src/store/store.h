// The model store under $M40_LLM_HOME (default ~/.m40-llm):
//
//   models/<name>/<tag>/model.gguf           the model, complete and verified
//   models/<name>/<tag>/manifest.json        what it is and where it came from
//   models/<name>/<tag>/model.gguf.partial   a download in progress (never listed)
//   models/<name>/<tag>/model.gguf.partial.json  what the partial file is (http_download.h)
//
// A model split into parts (llama.cpp's gguf-split) keeps them side by side
// under the names the GGUF loader looks for, whatever the source called them:
//
//   models/<name>/<tag>/model-00001-of-00003.gguf   part 1, the file the loader opens
//   models/<name>/<tag>/model-00002-of-00003.gguf   (found by name beside part 1)
//   models/<name>/<tag>/model-00003-of-00003.gguf
//   models/<name>/<tag>/model-00002-of-00003.gguf.partial (+ .json)  a part in progress
//
// and its manifest lists them ("parts"). A model exists when its manifest
// exists and every file it names is there; the manifest is written last, by
// rename, after the GGUF file (or every part) has been checked and moved
// into place.
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

// One file of a split model, as stored.
struct ManifestPart {
  std::string file;    // "model-00002-of-00003.gguf", in the model's folder
  uint64_t size = 0;
  std::string sha256;  // lower-case hex

  bool operator==(const ManifestPart&) const = default;
};

struct Manifest {
  std::string name;
  std::string tag;
  std::string source;      // URL or local path it was pulled from (a split model's first part)
  uint64_t size = 0;       // bytes of model.gguf, or of all the parts together
  std::string sha256;      // lower-case hex: of model.gguf, or split_sha256 of the parts
  std::string pulled_at;   // ISO 8601 UTC, "2026-11-21T06:50:00Z"
  std::optional<uint32_t> file_type;  // general.file_type
  std::string quant;       // its name ("Q8_0"), or the dominant tensor type
  std::string architecture;
  std::optional<OllamaExtras> ollama;  // pulled from the Ollama library
  std::vector<ManifestPart> parts;     // a split model's files in order; empty: one model.gguf

  // Not stored: the file to load, model.gguf or a split model's first part
  // (the loader reads the others from beside it).
  std::filesystem::path gguf_path;

  ModelName model_name() const { return {name, tag}; }
  // Every GGUF file of the model: gguf_path, and a split model's other parts.
  std::vector<std::filesystem::path> files() const;
};

// The sha256 that names a split model: of its parts' sha256s (lower-case
// hex), each followed by '\n', in order. A model whose parts are the same
// files has the same one, whoever split it into files of the same names.
std::string split_sha256(const std::vector<std::string>& part_sha256s);

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
  // Part `number` (1-based) of a split model of `count` parts, named as
  // gguf-split names them: "model-00002-of-00003.gguf".
  static std::string part_file_name(uint32_t number, uint32_t count);

  std::optional<Manifest> find(const ModelName& name) const;
  // Every model, sorted by name and tag; unreadable manifests are skipped.
  std::vector<Manifest> list() const;
  enum class Removed {
    Model,               // a model (and any partial download beside it)
    UnfinishedDownload,  // only a partial download, which never became a model
  };
  // Removes a model (its file or every part, manifest, any partial
  // download) or what an unfinished pull left. Throws m40::Error when there
  // is neither, and BusyError while a pull of the name holds the lock of a
  // partial file.
  Removed remove(const ModelName& name) const;

  // Moves a verified GGUF file (which must lie in model_dir(name)) to
  // model.gguf and writes the manifest (name, tag, gguf facts filled here).
  Manifest install(const ModelName& name, const std::filesystem::path& verified_file, Manifest manifest) const;
  // The same for a split model: verified_files[i] (in model_dir(name))
  // becomes manifest.parts[i].file. Files of the model stored there before
  // that the new one does not use (model.gguf, parts of another count) go
  // once the new manifest is in place.
  Manifest install(const ModelName& name, const std::vector<std::filesystem::path>& verified_files, Manifest manifest) const;

 private:
  std::filesystem::path home_;
};

// Fills file_type, quant and architecture from a GGUF file's header (a
// split model's first part, with the others beside it); throws
// m40::FormatError when it is not a valid GGUF file, m40::Error when a part
// is missing or belongs to another model.
void describe_gguf(const std::filesystem::path& path, Manifest& manifest);

std::string now_iso8601();
// "2 minutes ago", "3 days ago", relative to `now` (seconds since the epoch).
std::string relative_time(const std::string& iso8601, int64_t now);
// "750 KB", "4.7 GB" (decimal units, as Ollama prints them).
std::string human_size(uint64_t bytes);

}  // namespace m40::store
