// The prompts of shared/reference/*/*.tokens.json (llama.cpp's tokenization,
// BOS added, special tokens parsed) must give the same ids, and every token
// the same bytes.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>

#include "tokenizer/vocab.h"
#include "vocab_test_files.h"

namespace m40::tokenizer {
namespace {

namespace fs = std::filesystem;

std::string hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  for (unsigned char c : bytes) {
    s += kDigits[c >> 4];
    s += kDigits[c & 15];
  }
  return s;
}

TEST(TokenizerReference, TokenizeAsLlamaCppDid) {
  const fs::path reference = m40::test::shared_dir() / "reference";
  if (!fs::exists(reference)) GTEST_SKIP() << reference << " is not present";
  std::map<std::string, std::unique_ptr<Vocab>> vocabs;
  size_t checked = 0;
  for (const auto& dir : fs::directory_iterator(reference)) {
    if (!dir.is_directory()) continue;
    for (const auto& file : fs::directory_iterator(dir.path())) {
      const std::string name = file.path().filename().string();
      if (name.size() < 12 || name.substr(name.size() - 12) != ".tokens.json") continue;
      const auto j = nlohmann::json::parse(test::read_bytes(file.path()));
      std::string model = j.at("model").get<std::string>();
      if (model.rfind("shared/", 0) == 0) model = model.substr(7);
      const fs::path model_path = m40::test::shared_dir() / model;
      if (!fs::exists(model_path)) continue;
      auto& vocab = vocabs[model_path.string()];
      if (!vocab) vocab = std::make_unique<Vocab>(Vocab::from_file(model_path.string()));

      SCOPED_TRACE(file.path().string());
      EXPECT_EQ(vocab->size(), j.at("n_vocab").get<size_t>());
      EXPECT_EQ(vocab->add_bos(), j.at("vocab_add_bos").get<bool>());
      EXPECT_EQ(vocab->add_eos(), j.at("vocab_add_eos").get<bool>());
      EXPECT_EQ(vocab->special().bos, j.at("bos_id").get<TokenId>());
      EXPECT_EQ(vocab->special().eos, j.at("eos_id").get<TokenId>());
      const std::vector<TokenId> ids =
          vocab->encode(j.at("prompt").get<std::string>(), {.add_special = j.at("add_special").get<bool>(),
                                                           .parse_special = j.at("parse_special").get<bool>()});
      EXPECT_EQ(ids, j.at("token_ids").get<std::vector<TokenId>>());
      const auto pieces_hex = j.at("pieces_hex").get<std::vector<std::string>>();
      ASSERT_EQ(ids.size(), pieces_hex.size());
      for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(hex(vocab->piece(ids[i], true)), pieces_hex[i]) << "token " << i;
      ++checked;
    }
  }
  std::printf("[ reference] %zu prompts checked\n", checked);
  EXPECT_GT(checked, 0u);
}

// The greedy continuations' text: generated ids alone decode with the
// leading space dropped; prompt + generated (BOS first) keep it.
TEST(TokenizerReference, DecodeAsLlamaCppDid) {
  const fs::path reference = m40::test::shared_dir() / "reference";
  if (!fs::exists(reference)) GTEST_SKIP() << reference << " is not present";
  size_t checked = 0;
  for (const auto& dir : fs::directory_iterator(reference)) {
    if (!dir.is_directory()) continue;
    for (const auto& file : fs::directory_iterator(dir.path())) {
      const std::string name = file.path().filename().string();
      if (name.size() < 12 || name.substr(name.size() - 12) != ".greedy.json") continue;
      const fs::path tokens_file = file.path().parent_path() / (name.substr(0, name.size() - 12) + ".tokens.json");
      const auto t = nlohmann::json::parse(test::read_bytes(tokens_file));
      const auto g = nlohmann::json::parse(test::read_bytes(file.path()));
      std::string model = t.at("model").get<std::string>();
      if (model.rfind("shared/", 0) == 0) model = model.substr(7);
      const fs::path model_path = m40::test::shared_dir() / model;
      if (!fs::exists(model_path)) continue;
      const Vocab vocab = Vocab::from_file(model_path.string());
      SCOPED_TRACE(file.path().string());
      const auto generated = g.at("generated_ids").get<std::vector<TokenId>>();
      EXPECT_EQ(hex(vocab.decode(generated, {.remove_special = true})), g.at("generated_text_hex").get<std::string>());
      std::vector<TokenId> all = t.at("token_ids").get<std::vector<TokenId>>();
      all.insert(all.end(), generated.begin(), generated.end());
      EXPECT_EQ(vocab.decode(all), g.at("full_text").get<std::string>());
      ++checked;
    }
  }
  EXPECT_GT(checked, 0u);
}

}  // namespace
}  // namespace m40::tokenizer
