// One of llama.cpp's reference runs in ../shared/reference: prompt ids, the
// logits at the last prompt position (and at every position), and the greedy
// continuation with its per-step margins.
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "gguf/file.h"
#include "model/hparams.h"
#include "model/weights.h"
#include "test_paths.h"

namespace m40::test {

// A file of float32 little-endian values (llama.cpp's logits dumps).
inline std::vector<float> read_floats(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes{std::istreambuf_iterator<char>(in), {}};
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

struct GreedyStep {
  int32_t id;
  float margin_to_2nd;
};

struct ReferenceCase {
  std::filesystem::path stem;  // e.g. reference/tiny-llama-rand-F32/once-upon-a-time
  std::vector<int32_t> prompt;
  std::vector<GreedyStep> greedy;

  // `values_stem` (default: stem) names the run whose logits and greedy
  // continuation to read, when it has no prompt file of its own.
  static ReferenceCase load(const std::filesystem::path& stem, std::filesystem::path values_stem = {}) {
    ReferenceCase c;
    if (values_stem.empty()) values_stem = stem;
    c.stem = values_stem;
    std::ifstream tokens_file(stem.string() + ".tokens.json");
    const auto tokens = nlohmann::json::parse(tokens_file);  // named: a range-for over a temporary's member dangles
    for (const auto& id : tokens.at("token_ids")) c.prompt.push_back(id.get<int32_t>());
    std::ifstream greedy_file(values_stem.string() + ".greedy.json");
    const auto greedy = nlohmann::json::parse(greedy_file);
    for (const auto& step : greedy.at("steps")) {
      c.greedy.push_back({step["id"].get<int32_t>(), step["margin_to_2nd"].get<float>()});
    }
    return c;
  }

  // float32 little-endian logits, `rows` rows of n_vocab.
  std::vector<float> logits(const std::string& suffix = ".logits.bin") const {
    return read_floats(stem.string() + suffix);
  }
};

// The model file of a reference folder name.
inline std::filesystem::path model_for_reference(const std::string& name) {
  auto top = shared_model(name + ".gguf");
  return std::filesystem::exists(top) ? top : shared_model("synthetic/" + name + ".gguf");
}

// A model file opened for the CPU engine.
struct ModelUnderTest {
  gguf::File file;
  model::ModelHparams hparams;
  model::ModelWeights weights;

  explicit ModelUnderTest(const std::filesystem::path& path)
      : file(gguf::File::open(path.string())),
        hparams(model::ModelHparams::from_file(file)),
        weights(model::ModelWeights::load(file, hparams)) {}

  std::unique_ptr<cpu::CpuBackend> backend(backend::KvType kv = backend::KvType::F16, int n_ctx = 64) const {
    cpu::CpuBackendOptions o;
    o.n_ctx = n_ctx;
    o.kv_type = kv;
    o.threads = 2;
    return std::make_unique<cpu::CpuBackend>(hparams, weights, o);
  }
};

inline size_t argmax(const float* v, size_t n);

// Decodes greedily from ref.prompt through `backend` (sequence 0, fresh)
// for as long as the reference's steps have a margin of at least
// `min_margin` (below it a tie is legitimate), comparing every chosen
// token with the reference's. Returns how many steps matched; `mismatch`
// is the first step that did not (-1: none).
struct GreedyComparison {
  int matched = 0;
  int mismatch = -1;
  int32_t expected = 0, got = 0;
};
inline GreedyComparison compare_greedy(backend::Backend& backend, const ReferenceCase& ref, float min_margin) {
  const int n_vocab = backend.n_vocab();
  backend::Batch batch;
  const int n = static_cast<int>(ref.prompt.size());
  for (int i = 0; i < n; ++i) batch.add(ref.prompt[i], i, 0, i == n - 1);
  std::vector<float> logits(n_vocab);
  backend.forward(batch, logits);
  GreedyComparison c;
  for (size_t step = 0; step < ref.greedy.size(); ++step) {
    if (ref.greedy[step].margin_to_2nd < min_margin) break;
    const int32_t next = static_cast<int32_t>(argmax(logits.data(), n_vocab));
    if (next != ref.greedy[step].id) {
      c.mismatch = static_cast<int>(step);
      c.expected = ref.greedy[step].id;
      c.got = next;
      break;
    }
    ++c.matched;
    batch.clear();
    batch.add(next, n + static_cast<int32_t>(step), 0, true);
    backend.forward(batch, logits);
  }
  return c;
}

inline size_t argmax(const float* v, size_t n) { return static_cast<size_t>(std::max_element(v, v + n) - v); }

inline float max_abs_diff(const float* a, const float* b, size_t n) {
  float d = 0;
  for (size_t i = 0; i < n; ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

}  // namespace m40::test
