// Hugging Face: a repository's file listing and the choice of one GGUF model
// in it by quantization ("Q4_K_M"), as `ollama pull hf.co/ORG/REPO:QUANT`:
// one file, or every part of one split by llama.cpp's gguf-split
// (PREFIX-00001-of-0000N.gguf ... PREFIX-0000N-of-0000N.gguf).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "store/http_download.h"

namespace m40::store {

inline constexpr const char* kDefaultQuant = "Q4_K_M";

struct HfFile {
  std::string path;  // inside the repository
  uint64_t size = 0;
  std::optional<std::string> sha256;  // the LFS oid
};

// $M40_LLM_HF_ENDPOINT, else https://huggingface.co; no trailing '/'.
std::string hf_endpoint();
// Authorization from $HF_TOKEN, when set.
std::map<std::string, std::string> hf_headers();

// Parses GET {endpoint}/api/models/ORG/REPO/tree/main.
std::vector<HfFile> parse_hf_tree(const std::string& json);
// The rel="next" target of an HTTP Link header (RFC 8288), made absolute
// against `request_url` when it is a path; nullopt when there is none.
std::optional<std::string> next_page_url(const std::string& link_header, const std::string& request_url);
// Fetches and parses it, following the listing's pages (Hugging Face sends
// a Link: <...>; rel="next" header while there are more files); a missing
// repository is a one-line m40::Error. Every page is fetched under `policy`.
std::vector<HfFile> hf_list_files(const std::string& org, const std::string& repo, const RequestPolicy& policy = {});
std::string hf_file_url(const std::string& org, const std::string& repo, const std::string& path);

// The GGUF file for a quantization (case-insensitive): the file whose name
// carries it as a token, else contains it; one file rather than the parts of
// a split one, then the shortest path. With `quant` empty: Q4_K_M, or the
// only GGUF file. Throws m40::Error listing the quantizations there are.
// A split model comes back as one of its parts: model_files finds the rest.
HfFile select_gguf(const std::vector<HfFile>& files, const std::string& quant, const std::string& repo_label);

// The files of the model `chosen` belongs to, in order: {chosen} for one
// file, every part for a part of a split model (whichever part was chosen).
// Throws m40::Error naming the first part the listing lacks.
std::vector<HfFile> model_files(const std::vector<HfFile>& files, const HfFile& chosen, const std::string& repo_label);

}  // namespace m40::store
