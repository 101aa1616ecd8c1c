// Where tests find the shared models, the repository's reference data and
// the m40-llm binary.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace m40::test {

inline std::filesystem::path shared_dir() {
  if (const char* env = std::getenv("M40_SHARED_DIR"); env != nullptr && *env != '\0') return env;
  return M40_SHARED_DIR;
}
inline std::filesystem::path shared_model(const std::string& relative) {
  return shared_dir() / "models" / relative;
}
inline std::string binary_path() { return M40_BINARY_PATH; }
// Reference data kept in the repository (tests/data): what llama.cpp
// computed on models the tests write themselves.
inline std::filesystem::path repo_test_data(const std::string& relative) {
  return std::filesystem::path(M40_TEST_DATA_DIR) / relative;
}

}  // namespace m40::test
