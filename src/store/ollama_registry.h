// The Ollama library, as `ollama pull qwen3:8b` reads it: a name ->
// the registry's manifest (GET {registry}/v2/NAMESPACE/MODEL/manifests/TAG)
// -> the GGUF blob and the small text layers beside it (template, params,
// system, license), each named by its sha256 digest.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "store/http_download.h"
#include "store/model_name.h"
#include "store/store.h"

namespace m40::store {

inline constexpr const char* kDefaultOllamaRegistry = "https://registry.ollama.ai";
inline constexpr const char* kOllamaManifestMediaType = "application/vnd.docker.distribution.manifest.v2+json";
inline constexpr const char* kOllamaModelLayer = "application/vnd.ollama.image.model";
inline constexpr const char* kOllamaTemplateLayer = "application/vnd.ollama.image.template";
inline constexpr const char* kOllamaParamsLayer = "application/vnd.ollama.image.params";
inline constexpr const char* kOllamaSystemLayer = "application/vnd.ollama.image.system";
inline constexpr const char* kOllamaLicenseLayer = "application/vnd.ollama.image.license";
inline constexpr const char* kOllamaAdapterLayer = "application/vnd.ollama.image.adapter";

// $M40_LLM_OLLAMA_REGISTRY, else https://registry.ollama.ai; no trailing '/'.
std::string ollama_registry();

// [NAMESPACE/]MODEL[:TAG]; the namespace is "library" and the tag "latest"
// when left out, as in Ollama.
struct OllamaName {
  std::string space = "library";
  std::string model;
  std::string tag = kDefaultTag;

  // The name it is stored under: Ollama's own short form, without
  // "library/" ("qwen3:8b", "someuser/model:tag").
  ModelName store_name() const;
  // "library/qwen3", the repository part of the registry's URLs.
  std::string repository() const { return space + "/" + model; }
};

// nullopt when `ref` is not of that form (more '/'-separated parts, or
// characters a store name does not allow).
std::optional<OllamaName> parse_ollama_name(const std::string& ref);

struct OllamaLayer {
  std::string media_type;
  std::string sha256;  // lower-case hex, from the digest "sha256:<hex>"
  uint64_t size = 0;
};

struct OllamaManifest {
  OllamaLayer model;                 // the GGUF file
  std::vector<OllamaLayer> texts;    // template, params, system and license layers
  std::vector<std::string> ignored;  // media types of other layers (a vision projector, ...)
};

// Reads a registry manifest. Throws m40::Error, naming `label`, for one
// without a model layer (or with several), with an adapter layer (a LoRA
// m40-llm cannot apply) or with a digest that is not sha256.
OllamaManifest parse_ollama_manifest(const std::string& json, const std::string& label);

// Fetches and reads the manifest (under `policy`); an unknown name or tag
// (HTTP 404) is a one-line m40::Error saying so.
OllamaManifest fetch_ollama_manifest(const OllamaName& name, const RequestPolicy& policy = {});

// {registry}/v2/NAMESPACE/MODEL/blobs/sha256:<hex>; the registry answers it
// with a redirect to its CDN.
std::string ollama_blob_url(const OllamaName& name, const std::string& sha256);

// Fetches the manifest's text layers (under `policy`), each checked against
// its digest.
OllamaExtras fetch_ollama_extras(const OllamaName& name, const OllamaManifest& manifest,
                                 const RequestPolicy& policy = {});

}  // namespace m40::store
