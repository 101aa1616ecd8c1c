// `pull`: a model from a URL, from Hugging Face, from the Ollama library or
// from a local file into the store — resumed when interrupted, checked against its sha256 when the
// source says it, validated as GGUF, and only then made visible. A Hugging
// Face model split into parts (gguf-split) is pulled part by part, each
// resumed and checked on its own, and stored as one model (store.h).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>

#include "store/http_download.h"
#include "store/model_name.h"
#include "store/ollama_registry.h"
#include "store/store.h"

namespace m40::store {

enum class SourceKind {
  Url,              // http(s)://...
  HuggingFaceRepo,  // hf.co/ORG/REPO[:QUANT]
  HuggingFaceFile,  // [hf.co/]ORG/REPO/FILE.gguf
  LocalFile,        // an existing file
  OllamaLibrary,    // [NAMESPACE/]MODEL[:TAG], as `ollama pull` takes it
};

struct PullRef {
  SourceKind kind = SourceKind::Url;
  std::string location;  // the URL or the local path
  std::string org, repo, quant, file;  // Hugging Face parts
  OllamaName ollama;                    // an Ollama library name
  ModelName default_name;
};

// Reads a pull reference; throws m40::Error saying which forms exist.
// With `local_files` false, `ref` is never read as a path: nothing on the
// file system is looked at, so neither the answer nor the error depends on
// whether a file of that name exists (a server's requests).
PullRef parse_pull_ref(const std::string& ref, bool local_files = true);

struct PullOptions {
  std::string ref;
  std::optional<std::string> name;  // store name instead of the default
  bool terminal = false;            // draw a progress bar
  std::FILE* log = stderr;
  // Bytes done and total (when known) as the download or copy goes on
  // (the server's /api/pull status lines); for a split model, of all its
  // parts together.
  std::function<void(uint64_t done, std::optional<uint64_t> total)> on_progress;
  // Polled during the transfer: true stops the pull with InterruptedError
  // (a download's partial file is kept for the next pull to resume).
  std::function<bool()> interrupted;
  // A local file may be pulled (copied); false: see parse_pull_ref.
  bool local_files = true;
  // Checked for every connection of the pull (listings, manifests, the
  // download, redirects included): AddressRefusedError. Empty: any address.
  AddressCheck address_allowed;
  // The most bytes the model file (a split model: its parts together) may
  // have, besides the free space of the store's disk, which always caps it
  // (plus what partial downloads of the model hold already). A larger one stops with DownloadRefusedError
  // as soon as its size is known: from the source's listing, the
  // response's length, or the GGUF header in its first bytes.
  std::optional<SizeCap> max_size;
};

struct PullResult {
  Manifest manifest;
  bool unchanged = false;  // the same file (sha256) was there already
};

PullResult pull_model(const Store& store, const PullOptions& options);

}  // namespace m40::store
