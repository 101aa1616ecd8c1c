// jinja_cases.json: snippets exercising the Jinja features with what Jinja2
// itself rendered for each (written by make_jinja_cases.py in the
// environment transformers uses). Same bytes, or a failure where Jinja2
// failed.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "chat/chat_template.h"

namespace {

using Json = nlohmann::ordered_json;

struct Snippet {
  size_t index = 0;
  Json spec;
};

std::vector<Snippet> load() {
  std::ifstream in(std::string(M40_CHAT_TEST_DIR) + "/jinja_cases.json", std::ios::binary);
  std::vector<Snippet> out;
  if (!in) return out;
  std::stringstream ss;
  ss << in.rdbuf();
  const Json doc = Json::parse(ss.str());
  for (const auto& c : doc["cases"]) out.push_back(Snippet{out.size(), c});
  return out;
}

const std::vector<Snippet>& snippets() {
  static const std::vector<Snippet> s = load();
  return s;
}

class ChatJinjaCorpus : public testing::TestWithParam<Snippet> {};

TEST_P(ChatJinjaCorpus, MatchesJinja2) {
  const Json& c = GetParam().spec;
  const std::string source = c["template"].get<std::string>();
  SCOPED_TRACE("template: " + source);
  m40::chat::RenderOptions options;
  options.bos_token = "<s>";
  options.eos_token = "</s>";
  options.now = m40::chat::DateTime{2024, 7, 26, 0, 0, 0};
  Json messages = Json::array();
  for (const auto& [key, value] : c["variables"].items()) {
    if (key == "messages") messages = value;
    else options.extra_variables[key] = value;
  }
  if (c.contains("expected")) {
    const m40::chat::ChatTemplate tpl(source);
    EXPECT_EQ(tpl.render(messages, options), c["expected"].get<std::string>());
  } else {
    // Parse-time or render-time, as long as it fails with our error type.
    EXPECT_THROW(m40::chat::ChatTemplate(source).render(messages, options), m40::chat::TemplateError)
        << "Jinja2 failed with: " << c["error"].get<std::string>();
  }
}

INSTANTIATE_TEST_SUITE_P(Jinja2, ChatJinjaCorpus, testing::ValuesIn(snippets()),
                         [](const testing::TestParamInfo<Snippet>& p) {
                           return "case" + std::to_string(p.param.index);
                         });

TEST(ChatJinjaCorpusFound, HasCases) { EXPECT_GT(snippets().size(), 150u); }

}  // namespace
