// Every case of every shared/templates/NAME.cases.json: nine real chat
// templates rendered as transformers' apply_chat_template renders them
// (Python 3.11, Jinja2 3.1.2). The expected string must match byte for byte;
// a case that raised in Python must fail here too, and raise_exception()
// must carry its message verbatim.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

struct Case {
  std::string template_name;  // NAME of NAME.jinja
  std::string test_name;      // for gtest: NAME and case name, [A-Za-z0-9_] only
  fs::path template_path;
  std::string bos, eos;
  m40::chat::DateTime date;
  Json spec;  // the case object
};

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string identifier(const std::string& s) {
  std::string out;
  for (char c : s) out.push_back(std::isalnum(static_cast<unsigned char>(c)) ? c : '_');
  return out;
}

fs::path templates_dir() { return m40::test::shared_dir() / "templates"; }

std::vector<Case> load_cases() {
  std::vector<Case> cases;
  std::error_code ec;
  if (!fs::is_directory(templates_dir(), ec)) return cases;
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(templates_dir())) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 11 && name.substr(name.size() - 11) == ".cases.json") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& file : files) {
    const Json doc = Json::parse(read_file(file));
    const std::string tpl = doc["template_file"].get<std::string>();
    m40::chat::DateTime date;
    const std::string d = doc["strftime_now_date"].get<std::string>();  // YYYY-MM-DD
    date.year = std::stoi(d.substr(0, 4));
    date.month = std::stoi(d.substr(5, 2));
    date.day = std::stoi(d.substr(8, 2));
    for (const auto& c : doc["cases"]) {
      Case k;
      k.template_name = tpl.substr(0, tpl.size() - 6);
      k.test_name = identifier(k.template_name + "__" + c["name"].get<std::string>());
      k.template_path = templates_dir() / tpl;
      k.bos = doc["bos_token"].get<std::string>();
      k.eos = doc["eos_token"].get<std::string>();
      k.date = date;
      k.spec = c;
      cases.push_back(std::move(k));
    }
  }
  return cases;
}

const std::vector<Case>& all_cases() {
  static const std::vector<Case> cases = load_cases();
  return cases;
}

class ChatTemplateCases : public testing::TestWithParam<Case> {};

TEST_P(ChatTemplateCases, RendersAsTransformers) {
  const Case& c = GetParam();
  const m40::chat::ChatTemplate tpl(read_file(c.template_path));
  m40::chat::RenderOptions options;
  options.add_generation_prompt = c.spec["add_generation_prompt"].get<bool>();
  options.bos_token = c.bos;
  options.eos_token = c.eos;
  options.now = c.date;
  if (c.spec.contains("tools")) options.tools = c.spec["tools"];
  const Json& messages = c.spec["messages"];

  if (c.spec.contains("expected")) {
    EXPECT_EQ(tpl.render(messages, options), c.spec["expected"].get<std::string>());
    return;
  }
  const std::string kind = c.spec["error_kind"].get<std::string>();
  if (kind == "raise_exception") {
    try {
      tpl.render(messages, options);
      FAIL() << "expected raise_exception(" << c.spec["error"] << ")";
    } catch (const m40::chat::TemplateRaisedError& e) {
      EXPECT_EQ(std::string(e.what()), c.spec["error"].get<std::string>());
      EXPECT_EQ(e.message(), c.spec["error"].get<std::string>());
      EXPECT_GT(e.line(), 0);
    }
  } else {
    EXPECT_THROW(tpl.render(messages, options), m40::chat::TemplateRenderError) << "Python failed with: " << c.spec["error"];
  }
}

INSTANTIATE_TEST_SUITE_P(Shared, ChatTemplateCases, testing::ValuesIn(all_cases()),
                         [](const testing::TestParamInfo<Case>& p) { return p.param.test_name; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ChatTemplateCases);

// The case files are where the README says, and all of them were found: a
// missing shared folder must fail, not pass with zero cases.
TEST(ChatTemplateCasesFound, NineTemplatesSixtyThreeCases) {
  ASSERT_TRUE(fs::is_directory(templates_dir())) << templates_dir() << " (set M40_SHARED_DIR)";
  std::vector<std::string> templates;
  for (const auto& c : all_cases()) {
    if (std::find(templates.begin(), templates.end(), c.template_name) == templates.end()) {
      templates.push_back(c.template_name);
    }
  }
  EXPECT_EQ(templates.size(), 9u);
  EXPECT_EQ(all_cases().size(), 63u);
}

}  // namespace
