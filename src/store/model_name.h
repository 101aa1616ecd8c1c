// Store names: "tinystories:q8_0", "hf.co/ORG/REPO:Q4_K_M", "llama" (tag
// "latest"). A name is one or more '/'-separated components of letters,
// digits, '.', '_' and '-' (none of them "." or ".."); the tag after the last
// ':' has the same characters. Names are case-sensitive, as Hugging Face
// repositories are.
#pragma once

#include <optional>
#include <string>

namespace m40::store {

inline constexpr const char* kDefaultTag = "latest";

struct ModelName {
  std::string name;  // "hf.co/ORG/REPO"
  std::string tag;   // "Q4_K_M"

  std::string str() const { return name + ":" + tag; }
  bool operator==(const ModelName&) const = default;
};

// Parses "NAME[:TAG]"; throws m40::Error naming the rule broken.
ModelName parse_model_name(const std::string& text);
// The same, without throwing.
std::optional<ModelName> try_parse_model_name(const std::string& text);

// A name component made from arbitrary text (a file name): lower case,
// characters outside the allowed set become '-'.
std::string sanitize_name_component(const std::string& text);

// Whether a file name or path ends in ".gguf" (any case).
bool is_gguf_file_name(const std::string& file_name);

// The quantization named in a GGUF file name ("Llama-3-8B.Q4_K_M.gguf" ->
// "Q4_K_M"), in upper case; empty when there is none.
std::string quant_from_file_name(const std::string& file_name);

}  // namespace m40::store
