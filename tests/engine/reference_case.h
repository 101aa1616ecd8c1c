// One of llama.cpp's reference runs in ../shared/reference: prompt ids, the
// logits at the last prompt position (and at every position), and the greedy
// continuation with its per-step margins.
#pragma once

#include <filesystem>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "test_paths.h"

namespace m40::test {

struct GreedyStep {
  int32_t id;
  float margin_to_2nd;
};

struct ReferenceCase {
  std::filesystem::path stem;  // e.g. reference/tiny-llama-rand-F32/once-upon-a-time
  std::vector<int32_t> prompt;
  std::vector<GreedyStep> greedy;

  static ReferenceCase load(const std::filesystem::path& stem) {
    ReferenceCase c;
    c.stem = stem;
    std::ifstream tokens_file(stem.string() + ".tokens.json");
    const auto tokens = nlohmann::json::parse(tokens_file);  // named: a range-for over a temporary's member dangles
    for (const auto& id : tokens.at("token_ids")) c.prompt.push_back(id.get<int32_t>());
    std::ifstream greedy_file(stem.string() + ".greedy.json");
    const auto greedy = nlohmann::json::parse(greedy_file);
    for (const auto& step : greedy.at("steps")) {
      c.greedy.push_back({step["id"].get<int32_t>(), step["margin_to_2nd"].get<float>()});
    }
    return c;
  }

  // float32 little-endian logits, `rows` rows of n_vocab.
  std::vector<float> logits(const std::string& suffix = ".logits.bin") const {
    std::ifstream in(stem.string() + suffix, std::ios::binary);
    std::vector<char> bytes{std::istreambuf_iterator<char>(in), {}};
    std::vector<float> v(bytes.size() / 4);
    std::memcpy(v.data(), bytes.data(), v.size() * 4);
    return v;
  }
};

// The model file of a reference folder name.
inline std::filesystem::path model_for_reference(const std::string& name) {
  auto top = shared_model(name + ".gguf");
  return std::filesystem::exists(top) ? top : shared_model("synthetic/" + name + ".gguf");
}

}  // namespace m40::test
