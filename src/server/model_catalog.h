// The models a client may name: every model of the store, the model serve
// was started with and the resident one (/api/tags, /v1/models).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "server/model_manager.h"

namespace m40::server {

struct AvailableModel {
  std::string name;   // "tiny:q8_0", or a file's name without .gguf
  std::string path;   // canonical
  uint64_t size = 0;
  std::chrono::system_clock::time_point modified{};
  std::string digest;        // sha256 (store models)
  std::string architecture;  // from the manifest; empty for files outside the store
  std::string quant;
};

// Sorted by name; a file appears once, under its first name.
std::vector<AvailableModel> available_models(const ModelManager& models);

// Ollama writes names with a tag: "model" -> "model:latest".
std::string ollama_name(const std::string& name);

}  // namespace m40::server
