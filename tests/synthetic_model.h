// Models the tests write themselves with gen-model's writer
// (model/synthetic_llama.h), beside what ../shared holds.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include "gguf/file.h"
#include "model/synthetic_llama.h"
#include "test_paths.h"

namespace m40::test {

// gen-model's `shape` with `recipe` weights (seed 1234) and the tokenizer of
// the shared model `tokenizer` (a path under ../shared/models), written to
// the temp folder under a name of the shape, the recipe and the process;
// an empty path when the shared model is missing. The caller removes it.
inline std::filesystem::path write_synthetic_model(const std::string& shape, const std::string& recipe,
                                                   const std::string& tokenizer) {
  const auto tokenizer_path = shared_model(tokenizer);
  if (!std::filesystem::exists(tokenizer_path)) return {};
  const gguf::File source = gguf::File::open(tokenizer_path.string());
  model::SyntheticOptions o;
  o.shape = *model::synthetic_shape(shape);
  o.recipe = recipe;
  o.seed = 1234;
  o.threads = 1;
  o.tokenizer_source = &source;
  const auto path = std::filesystem::temp_directory_path() /
                    ("m40-test-" + shape + "-" + recipe + "-" + std::to_string(::getpid()) + ".gguf");
  model::write_synthetic_llama(o, path.string());
  return path;
}

}  // namespace m40::test
