// `m40-llm show`, run as a user runs it: the built binary on every shared
// GGUF file. Key facts in its --json output must match shared/models/README.md
// and synthetic/README.md (independent of our code, hence hard-coded here);
// a missing or corrupt file must give exit status 1 and one line on stderr.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "binary_runner.h"
#include "test_paths.h"

namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

using RunResult = m40::test::BinaryResult;

std::string read_file(const fs::path& path) { return m40::test::read_text_file(path); }

// Runs the m40-llm binary with `args` (no shell), capturing stdout and stderr.

RunResult run_m40(const std::vector<std::string>& args, const std::string& stdin_path = "") {
  return m40::test::run_binary(args, stdin_path);
}

Json show_json(const std::string& relative, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"show", m40::test::shared_model(relative).string(), "--json"};
  args.insert(args.end(), extra.begin(), extra.end());
  const RunResult r = run_m40(args);
  EXPECT_EQ(r.exit_code, 0) << relative << ": " << r.err;
  EXPECT_EQ(r.err, "") << relative;
  try {
    return Json::parse(r.out);
  } catch (const Json::exception& e) {
    ADD_FAILURE() << relative << ": --json output is not JSON: " << e.what() << "\n" << r.out.substr(0, 500);
    return Json::object();
  }
}

std::map<std::string, int> tensor_type_counts(const Json& j) {
  std::map<std::string, int> counts;
  for (const auto& t : j.at("tensor_types")) counts[t.at("type").get<std::string>()] = t.at("count").get<int>();
  return counts;
}

// ---------------------------------------------------------------- models

struct ModelFacts {
  const char* file;
  uint64_t size;
  uint32_t file_type;
  int n_layer, n_embd, n_head, n_head_kv, n_ff, n_ctx, vocab;
  const char* pre;  // nullptr: the file has no tokenizer.ggml.pre
  bool tied;
  std::map<std::string, int> tensor_types;
};

// shared/models/README.md (table, per-file notes) and synthetic/README.md.
const ModelFacts kModels[] = {
    {"TinyStories-656K-Q8_0.gguf", 749'728, 7, 2, 128, 8, 4, 384, 512, 2048, "default", true,
     {{"Q8_0", 15}, {"F32", 5}}},
    {"TinyStories-656K-Q2_K.gguf", 553'120, 10, 2, 128, 8, 4, 384, 512, 2048, "default", true,
     {{"IQ4_NL", 14}, {"Q8_0", 1}, {"F32", 5}}},
    {"llama-2-tiny-random.gguf", 1'750'560, 1, 1, 8, 2, 2, 32, 4096, 32000, nullptr, false,
     {{"F16", 9}, {"F32", 3}}},
    {"synthetic/tiny-llama-rand-F32.gguf", 10'541'248, 0, 2, 256, 4, 2, 768, 512, 2048, "default", false,
     {{"F32", 21}}},
    {"synthetic/tiny-llama-rand-F16.gguf", 5'298'400, 1, 2, 256, 4, 2, 768, 512, 2048, "default", false,
     {{"F16", 16}, {"F32", 5}}},
    {"synthetic/tiny-llama-rand-Q8_0.gguf", 2'840'800, 7, 2, 256, 4, 2, 768, 512, 2048, "default", false,
     {{"Q8_0", 16}, {"F32", 5}}},
    {"synthetic/tiny-llama-rand-Q4_0.gguf", 1'665'248, 2, 2, 256, 4, 2, 768, 512, 2048, "default", false,
     {{"Q4_0", 15}, {"Q6_K", 1}, {"F32", 5}}},
    {"synthetic/tiny-llama-rand-Q4_K_M.gguf", 1'724'384, 15, 2, 256, 4, 2, 768, 512, 2048, "default", false,
     {{"Q4_K", 13}, {"Q6_K", 3}, {"F32", 5}}},
};

// llama.cpp's names of the file types above (enum llama_ftype).
const std::map<uint32_t, std::string> kFileTypeNames = {
    {0, "ALL_F32"}, {1, "MOSTLY_F16"}, {2, "MOSTLY_Q4_0"}, {7, "MOSTLY_Q8_0"}, {10, "MOSTLY_Q2_K"},
    {15, "MOSTLY_Q4_K_M"}};

void PrintTo(const ModelFacts& m, std::ostream* os) { *os << m.file; }

class ShowModel : public testing::TestWithParam<ModelFacts> {};

std::string param_name(const char* file) {
  std::string name = file;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

}  // namespace

TEST_P(ShowModel, JsonFactsMatchTheReadme) {
  const ModelFacts& m = GetParam();
  const Json j = show_json(m.file);
  ASSERT_TRUE(j.contains("model")) << j.dump();
  EXPECT_EQ(j["file_size"], m.size);
  EXPECT_EQ(j["gguf_version"], 3);
  EXPECT_EQ(j["model"]["architecture"], "llama");
  EXPECT_EQ(j["model"]["file_type"]["id"], m.file_type);
  EXPECT_EQ(j["model"]["file_type"]["name"], kFileTypeNames.at(m.file_type));

  const Json& a = j["architecture"];
  EXPECT_EQ(a["block_count"], m.n_layer);
  EXPECT_EQ(a["embedding_length"], m.n_embd);
  EXPECT_EQ(a["head_count"], m.n_head);
  EXPECT_EQ(a["head_count_kv"], m.n_head_kv);
  EXPECT_EQ(a["head_dim"], m.n_embd / m.n_head);
  EXPECT_EQ(a["feed_forward_length"], m.n_ff);
  EXPECT_EQ(a["context_length"], m.n_ctx);
  EXPECT_EQ(a["vocab_size"], m.vocab);
  EXPECT_EQ(a["rope_dimension_count"], m.n_embd / m.n_head);
  EXPECT_EQ(a["output_tied"], m.tied);

  const Json& t = j["tokenizer"];
  EXPECT_EQ(t["model"], "llama");
  EXPECT_EQ(t["token_count"], m.vocab);
  if (m.pre != nullptr) {
    EXPECT_EQ(t["pre"], m.pre);
  } else {
    EXPECT_FALSE(t.contains("pre"));
  }
  EXPECT_EQ(t["chat_template"], false);  // "None of the three has tokenizer.chat_template"
  EXPECT_EQ(t["special_tokens"]["bos"]["id"], 1);
  EXPECT_EQ(t["special_tokens"]["eos"]["id"], 2);

  int tensor_count = 0;
  for (const auto& [type, count] : m.tensor_types) tensor_count += count;
  EXPECT_EQ(j["tensor_count"], tensor_count);
  EXPECT_EQ(tensor_type_counts(j), m.tensor_types);
}

TEST_P(ShowModel, TextReportAndEveryFlagSucceed) {
  const ModelFacts& m = GetParam();
  const std::string path = m40::test::shared_model(m.file).string();
  const RunResult plain = run_m40({"show", path});
  EXPECT_EQ(plain.exit_code, 0) << plain.err;
  for (const char* section : {"Model", "Architecture", "Tokenizer", "Tensors by type"}) {
    EXPECT_NE(plain.out.find(std::string("  ") + section + "\n"), std::string::npos) << section;
  }
  const RunResult full = run_m40({"show", path, "--tensors", "--metadata"});
  EXPECT_EQ(full.exit_code, 0) << full.err;
  EXPECT_NE(full.out.find("blk.0.attn_q.weight"), std::string::npos);
  EXPECT_NE(full.out.find("general.architecture"), std::string::npos);
  EXPECT_EQ(full.err, "");
}

INSTANTIATE_TEST_SUITE_P(SharedModels, ShowModel, testing::ValuesIn(kModels),
                         [](const testing::TestParamInfo<ModelFacts>& param_info) {
                           return param_name(param_info.param.file);
                         });

// ---------------------------------------------------------------- vocabularies

namespace {

struct VocabFacts {
  const char* file;
  const char* arch;
  const char* model;
  const char* pre;  // nullptr: none
  int tokens;
  bool merges;
  bool chat_template;
  uint64_t size;
};

// shared/models/README.md, "vocab/" table.
const VocabFacts kVocabs[] = {
    {"ggml-vocab-llama-spm.gguf", "llama", "llama", "default", 32000, false, false, 723'869},
    {"ggml-vocab-phi-3.gguf", "phi3", "llama", "default", 32064, false, true, 726'019},
    {"ggml-vocab-baichuan.gguf", "baichuan", "llama", nullptr, 64000, false, false, 1'340'998},
    {"ggml-vocab-bert-bge.gguf", "bert", "bert", "bert-bge", 30522, false, false, 627'549},
    {"ggml-vocab-deepseek-coder.gguf", "llama", "gpt2", "deepseek-coder", 32256, true, false, 1'156'067},
    {"ggml-vocab-deepseek-llm.gguf", "llama", "gpt2", "deepseek-llm", 102400, true, false, 3'970'167},
    {"ggml-vocab-falcon.gguf", "falcon", "gpt2", "falcon", 65024, true, false, 2'287'728},
    {"ggml-vocab-gpt-2.gguf", "gpt2", "gpt2", "gpt-2", 50257, true, false, 1'766'807},
    {"ggml-vocab-gpt-neox.gguf", "gptneox", "gpt2", nullptr, 50432, true, false, 1'771'431},
    {"ggml-vocab-mpt.gguf", "mpt", "gpt2", "mpt", 50432, true, false, 1'771'393},
    {"ggml-vocab-refact.gguf", "refact", "gpt2", "refact", 49216, true, false, 1'720'710},
    {"ggml-vocab-starcoder.gguf", "starcoder2", "gpt2", "starcoder", 49152, true, false, 1'719'346},
};

void PrintTo(const VocabFacts& v, std::ostream* os) { *os << v.file; }

class ShowVocab : public testing::TestWithParam<VocabFacts> {};

}  // namespace

TEST_P(ShowVocab, JsonFactsMatchTheReadme) {
  const VocabFacts& v = GetParam();
  const Json j = show_json(std::string("vocab/") + v.file);
  ASSERT_TRUE(j.contains("model")) << j.dump();
  EXPECT_EQ(j["file_size"], v.size);
  EXPECT_EQ(j["tensor_count"], 0);
  EXPECT_TRUE(j["tensor_types"].empty());
  EXPECT_EQ(j["model"]["architecture"], v.arch);
  EXPECT_EQ(j["model"]["parameter_count"], 0);
  EXPECT_FALSE(j["architecture"].contains("output_tied"));
  const Json& t = j["tokenizer"];
  EXPECT_EQ(t["model"], v.model);
  if (v.pre != nullptr) {
    EXPECT_EQ(t["pre"], v.pre);
  } else {
    EXPECT_FALSE(t.contains("pre"));
  }
  EXPECT_EQ(t["token_count"], v.tokens);
  EXPECT_EQ(t.contains("merge_count"), v.merges);
  EXPECT_EQ(t["chat_template"], v.chat_template);
}

TEST_P(ShowVocab, TextReportAndEveryFlagSucceed) {
  const VocabFacts& v = GetParam();
  const std::string path = m40::test::shared_model(std::string("vocab/") + v.file).string();
  const RunResult plain = run_m40({"show", path});
  EXPECT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_NE(plain.out.find("  Tokenizer\n"), std::string::npos);
  EXPECT_NE(plain.out.find("vocabulary-only"), std::string::npos);
  const RunResult full = run_m40({"show", path, "--tensors", "--metadata", "--json"});
  EXPECT_EQ(full.exit_code, 0) << full.err;
  const Json j = Json::parse(full.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_TRUE(j["tensors"].empty());
  const Json& tokens = j["metadata"]["tokenizer.ggml.tokens"];
  EXPECT_EQ(tokens["length"], v.tokens);
  EXPECT_EQ(tokens["truncated"], true);
  EXPECT_EQ(tokens["element_type"], "string");
  EXPECT_EQ(tokens["value"].size(), 16u);
}

INSTANTIATE_TEST_SUITE_P(SharedVocabularies, ShowVocab, testing::ValuesIn(kVocabs),
                         [](const testing::TestParamInfo<VocabFacts>& param_info) {
                           return param_name(param_info.param.file);
                         });

// ---------------------------------------------------------------- details

TEST(Show, TinyStoriesSpecialTokensCarryTheirText) {
  const Json t = show_json("TinyStories-656K-Q8_0.gguf")["tokenizer"];
  EXPECT_EQ(t["special_tokens"]["bos"]["text"], "<|start_story|>");
  EXPECT_EQ(t["special_tokens"]["eos"]["text"], "<|end_story|>");
  EXPECT_EQ(t["special_tokens"]["unk"]["id"], 0);
  EXPECT_EQ(t["special_tokens"]["pad"]["id"], 0);
  EXPECT_EQ(t["add_bos"], true);
  EXPECT_EQ(t["add_eos"], false);
}

TEST(Show, TinyStoriesModelFacts) {
  const Json j = show_json("TinyStories-656K-Q8_0.gguf");
  EXPECT_EQ(j["model"]["name"], "Raincandy U TinyStories 656K");
  EXPECT_EQ(j["model"]["parameters"], "656.0K");
  EXPECT_EQ(j["architecture"]["rope_freq_base"], 10000.0);
  EXPECT_EQ(j["architecture"]["rms_norm_eps"], 1e-6);
}

TEST(Show, TensorListGivesShapesInGgmlOrder) {
  const Json j = show_json("TinyStories-656K-Q8_0.gguf", {"--tensors"});
  ASSERT_EQ(j["tensors"].size(), 20u);
  bool found = false;
  for (const auto& t : j["tensors"]) {
    if (t["name"] == "token_embd.weight") {
      found = true;
      EXPECT_EQ(t["type"], "Q8_0");
      EXPECT_EQ(t["shape"], Json::array({128, 2048}));  // row length (n_embd) first
      EXPECT_EQ(t["bytes"], 2048 / 32 * 128 * 34);        // Q8_0: 34 bytes per 32 values
      EXPECT_EQ(t["file_offset"].get<uint64_t>(), j["data_offset"].get<uint64_t>() + t["offset"].get<uint64_t>());
    }
    EXPECT_NE(t["name"], "output.weight");  // tied to token_embd.weight
  }
  EXPECT_TRUE(found);
  EXPECT_FALSE(j.contains("metadata"));
}

TEST(Show, MetadataKeepsShortValuesWhole) {
  const Json md = show_json("TinyStories-656K-Q8_0.gguf", {"--metadata"})["metadata"];
  EXPECT_EQ(md["general.architecture"]["type"], "string");
  EXPECT_EQ(md["general.architecture"]["value"], "llama");
  EXPECT_EQ(md["llama.block_count"]["value"], 2);
  EXPECT_EQ(md["general.file_type"]["value"], 7);
}

TEST(Show, HelpDescribesTheFlags) {
  const RunResult r = run_m40({"show", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* flag : {"--tensors", "--metadata", "--json", "MODEL"}) {
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
  }
}

// ---------------------------------------------------------------- errors

namespace {

void expect_one_line_error(const RunResult& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "not one line: " << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
}

fs::path write_temp(const std::string& name, const std::string& bytes) {
  const fs::path path = fs::path(testing::TempDir()) / (std::to_string(::getpid()) + "_" + name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

}  // namespace

TEST(ShowErrors, MissingFileIsOneLineAndExitOne) {
  const std::string path = (fs::path(testing::TempDir()) / "no-such-model.gguf").string();
  expect_one_line_error(run_m40({"show", path}), "no-such-model.gguf");
  expect_one_line_error(run_m40({"show", path, "--json"}), "no-such-model.gguf");
}

TEST(ShowErrors, NotAGgufFileIsOneLineAndExitOne) {
  const fs::path path = write_temp("notes.gguf", "these are not the bytes you are looking for\n");
  expect_one_line_error(run_m40({"show", path.string()}), "not a GGUF file");
  fs::remove(path);
}

TEST(ShowErrors, TruncatedFileIsOneLineAndExitOne) {
  const std::string model = read_file(m40::test::shared_model("TinyStories-656K-Q8_0.gguf"));
  ASSERT_EQ(model.size(), 749'728u);

  const fs::path in_metadata = write_temp("cut-metadata.gguf", model.substr(0, 1000));
  expect_one_line_error(run_m40({"show", in_metadata.string()}), "truncated");
  fs::remove(in_metadata);

  const fs::path in_data = write_temp("cut-data.gguf", model.substr(0, 700'000));
  expect_one_line_error(run_m40({"show", in_data.string(), "--json"}), "outside the file");
  fs::remove(in_data);
}

TEST(ShowErrors, DirectoryIsRefused) {
  expect_one_line_error(run_m40({"show", testing::TempDir()}), "is a directory");
}
