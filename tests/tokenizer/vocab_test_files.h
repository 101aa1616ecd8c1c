// Reading llama.cpp's tokenizer test files (models/ggml-vocab-NAME.gguf.inp
// and .out); the format is described in shared/reference/VOCAB-TESTS.md.
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_paths.h"
#include "tokenizer/vocab.h"

namespace m40::tokenizer::test {

inline std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct VocabCase {
  std::string text;
  std::vector<TokenId> expected;
};

inline std::filesystem::path vocab_path(const std::string& name) {
  return m40::test::shared_model("vocab/ggml-vocab-" + name + ".gguf");
}

// The cases of one vocabulary; empty if its files are missing.
inline std::vector<VocabCase> read_vocab_cases(const std::string& name) {
  const auto gguf = vocab_path(name);
  const std::string inp = read_bytes(gguf.string() + ".inp");
  const std::string out = read_bytes(gguf.string() + ".out");
  std::vector<std::string> texts;
  const std::string separator = "\n__ggml_vocab_test__\n";
  size_t start = 0;
  for (size_t pos; (pos = inp.find(separator, start)) != std::string::npos; start = pos + separator.size()) {
    texts.push_back(inp.substr(start, pos - start));
  }
  if (start < inp.size()) texts.push_back(inp.substr(start));

  std::vector<std::vector<TokenId>> ids;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream numbers(line);
    std::vector<TokenId> row;
    for (long id; numbers >> id;) row.push_back(static_cast<TokenId>(id));
    ids.push_back(std::move(row));
  }
  std::vector<VocabCase> cases;
  if (texts.size() != ids.size()) return cases;
  for (size_t i = 0; i < texts.size(); ++i) cases.push_back({texts[i], ids[i]});
  return cases;
}

inline std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

inline std::string join_ids(const std::vector<TokenId>& ids) {
  std::string s;
  for (TokenId id : ids) {
    s += ' ';
    s += std::to_string(id);
  }
  return s;
}

}  // namespace m40::tokenizer::test
