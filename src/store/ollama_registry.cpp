#include "store/ollama_registry.h"

#include <nlohmann/json.hpp>

#include <cctype>
#include <cstdlib>

#include "common/error.h"
#include "store/http_download.h"
#include "store/sha256.h"

namespace m40::store {

namespace {

// "sha256:<64 hex>" -> the hex; throws for any other digest.
std::string sha256_of_digest(const std::string& digest, const std::string& label) {
  std::string hex = digest.starts_with("sha256:") ? digest.substr(7) : "";
  if (!is_sha256_hex(hex)) throw Error("the Ollama manifest of " + label + " has a layer digest that is not sha256: '" + digest + "'");
  for (auto& c : hex) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return hex;
}

std::string name_label(const OllamaName& name) { return name.store_name().str(); }

bool is_text_layer(const std::string& media_type) {
  return media_type == kOllamaTemplateLayer || media_type == kOllamaParamsLayer || media_type == kOllamaSystemLayer ||
         media_type == kOllamaLicenseLayer;
}

}  // namespace

std::string ollama_registry() {
  std::string registry = kDefaultOllamaRegistry;
  if (const char* env = std::getenv("M40_LLM_OLLAMA_REGISTRY"); env != nullptr && *env != '\0') registry = env;
  while (registry.ends_with('/')) registry.pop_back();
  return registry;
}

ModelName OllamaName::store_name() const {
  return {space == "library" ? model : space + "/" + model, tag};
}

std::optional<OllamaName> parse_ollama_name(const std::string& ref) {
  // The store's name rules are Ollama's characters; they also split the tag.
  const auto parsed = try_parse_model_name(ref);
  if (!parsed) return std::nullopt;
  OllamaName name;
  name.tag = parsed->tag;
  const size_t slash = parsed->name.find('/');
  if (slash == std::string::npos) {
    name.model = parsed->name;
  } else {
    if (parsed->name.find('/', slash + 1) != std::string::npos) return std::nullopt;  // a host or a file path
    name.space = parsed->name.substr(0, slash);
    name.model = parsed->name.substr(slash + 1);
  }
  return name;
}

OllamaManifest parse_ollama_manifest(const std::string& json, const std::string& label) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(json);
  } catch (const std::exception& e) {
    throw Error("the Ollama manifest of " + label + " is not valid JSON: " + e.what());
  }
  if (!doc.is_object() || !doc.contains("layers") || !doc["layers"].is_array()) {
    throw Error("the Ollama manifest of " + label + " lists no layers");
  }
  OllamaManifest manifest;
  int model_layers = 0;
  for (const auto& entry : doc["layers"]) {
    if (!entry.is_object()) continue;
    OllamaLayer layer;
    layer.media_type = entry.value("mediaType", "");
    if (entry.contains("size") && entry["size"].is_number_unsigned()) layer.size = entry["size"].get<uint64_t>();
    const std::string digest = entry.contains("digest") && entry["digest"].is_string() ? entry["digest"].get<std::string>() : "";
    if (layer.media_type == kOllamaModelLayer) {
      layer.sha256 = sha256_of_digest(digest, label);
      manifest.model = layer;
      ++model_layers;
    } else if (layer.media_type == kOllamaAdapterLayer) {
      // The GGUF alone would be another model than the one named.
      throw Error(label + " is a model with a LoRA adapter layer, which m40-llm cannot apply");
    } else if (is_text_layer(layer.media_type)) {
      layer.sha256 = sha256_of_digest(digest, label);
      manifest.texts.push_back(layer);
    } else {
      manifest.ignored.push_back(layer.media_type);
    }
  }
  if (model_layers == 0) {
    throw Error("the Ollama manifest of " + label + " has no model layer (" + kOllamaModelLayer +
                "), so there is no GGUF file to pull");
  }
  if (model_layers > 1) {
    throw Error("the Ollama manifest of " + label + " has " + std::to_string(model_layers) +
                " model layers; m40-llm loads one GGUF file");
  }
  return manifest;
}

OllamaManifest fetch_ollama_manifest(const OllamaName& name, const RequestPolicy& policy) {
  const std::string registry = ollama_registry();
  const std::string url = registry + "/v2/" + name.repository() + "/manifests/" + name.tag;
  std::string json;
  try {
    json = http_get_text(url, {{"Accept", kOllamaManifestMediaType}}, nullptr, policy);
  } catch (const HttpStatusError& e) {
    if (e.status() == 404) {
      std::string message = "model '" + name_label(name) + "' not found in the Ollama library at " + registry + " (HTTP 404)";
      // ORG/REPO is often a Hugging Face repository meant without its prefix.
      if (name.space != "library") {
        message += "; a Hugging Face repository is pulled as hf.co/" + name.repository() +
                   (name.tag == kDefaultTag ? "" : ":" + name.tag);
      }
      // Still an HttpStatusError, so that the server's /api/pull answers 404.
      throw HttpStatusError(message, 404);
    }
    if (e.status() == 401 || e.status() == 403) {
      throw HttpStatusError("access denied (HTTP " + std::to_string(e.status()) + ") by the Ollama registry for " +
                                name_label(name) + ": m40-llm pulls public models only",
                            e.status());
    }
    throw;
  }
  return parse_ollama_manifest(json, name_label(name));
}

std::string ollama_blob_url(const OllamaName& name, const std::string& sha256) {
  return ollama_registry() + "/v2/" + name.repository() + "/blobs/sha256:" + sha256;
}

OllamaExtras fetch_ollama_extras(const OllamaName& name, const OllamaManifest& manifest, const RequestPolicy& policy) {
  OllamaExtras extras;
  for (const auto& layer : manifest.texts) {
    const std::string url = ollama_blob_url(name, layer.sha256);
    const std::string text = http_get_text(url, {}, nullptr, policy);
    Sha256 hash;
    hash.update(text.data(), text.size());
    if (const std::string sha = hash.hex_digest(); sha != layer.sha256) {
      throw Error("download of " + url + " is corrupt: sha256 " + sha + " does not match the expected " + layer.sha256 +
                  "; nothing was stored, pull again");
    }
    if (layer.media_type == kOllamaTemplateLayer) extras.template_text = text;
    else if (layer.media_type == kOllamaParamsLayer) extras.params = text;
    else if (layer.media_type == kOllamaSystemLayer) extras.system = text;
    else if (layer.media_type == kOllamaLicenseLayer) extras.licenses.push_back(text);
  }
  return extras;
}

}  // namespace m40::store
