// The one call other commands (`run`, `show`, `bench`, `serve`) need from the
// store: a model reference -> the GGUF file to load.
#pragma once

#include <string>

namespace m40::store {

// An existing file path is returned as given; otherwise `ref` is read as a
// store name ("tinystories:q8_0", "hf.co/ORG/REPO:Q4_K_M"; tag "latest" when
// left out) and the path of its model.gguf under $M40_LLM_HOME is returned.
// Throws m40::Error when neither exists, naming the pull command after
// which `ref` would be found: "model 'qwen3:8b' not found: pull it with
// m40-llm pull qwen3:8b", or, where pull stores it under another name
// (a URL, ORG/REPO/FILE.gguf, library/NAME), that name.
std::string resolve_model(const std::string& ref);

// A store name only (a server's requests): `ref` is never read as a file
// path and nothing outside the store is looked at, so that neither the
// answer nor the error tells whether a file of that name exists. Throws
// m40::Error as resolve_model does when the store has no such model.
std::string resolve_stored_model(const std::string& ref);

}  // namespace m40::store
