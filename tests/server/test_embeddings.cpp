// The embedding routes end to end (/v1/embeddings, /api/embed,
// /api/embeddings) on copies of the tiny qwen3 model that declare a pooling
// (qwen3.pooling_type: last, as Qwen3-Embedding's files do, with its EOS
// appended; mean; cls; rank) and on the generative TinyStories model: the
// shapes of each API's answer, vectors of length 1 that are the pooled
// hidden states of an independent forward pass, the same vector for a text
// alone and inside a batch, base64 that decodes to the float list,
// `dimensions`, truncation, and 400s for bad input and fields that are not
// implemented.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "backends/cpu/cpu_backend.h"
#include "gguf_copy.h"
#include "in_process_server.h"
#include "model/loaded_model.h"
#include "test_paths.h"
#include "tokenizer/vocab.h"

using namespace m40;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

fs::path qwen3() { return test::shared_model("arch/tiny-qwen3-F32.gguf"); }

// The hidden states of every token of `tokens` (one forward pass of a fresh
// CPU backend on the model), pooled as `pooling` says and normalized here.
std::vector<float> reference_embedding(const fs::path& model_path, const std::vector<int32_t>& tokens, const std::string& pooling) {
  auto model = model::LoadedModel::open(model_path.string());
  cpu::CpuBackend backend(model->hparams, model->weights, cpu::CpuBackendOptions{.n_ctx = 256, .n_seq = 1, .threads = 2});
  const size_t n_embd = model->hparams.n_embd, n = tokens.size();
  backend::Batch batch;
  batch.output_embeddings = true;
  for (size_t i = 0; i < n; ++i) batch.add(tokens[i], static_cast<int>(i), 0, true);
  std::vector<float> hidden(n * n_embd);
  backend.forward(batch, hidden);
  std::vector<double> v(n_embd, 0.0);
  for (size_t j = 0; j < n_embd; ++j) {
    if (pooling == "mean") {
      for (size_t t = 0; t < n; ++t) v[j] += hidden[t * n_embd + j];
      v[j] /= static_cast<double>(n);
    } else {
      v[j] = hidden[(pooling == "cls" ? 0 : n - 1) * n_embd + j];
    }
  }
  double norm = 0;
  for (double x : v) norm += x * x;
  std::vector<float> out(n_embd);
  for (size_t j = 0; j < n_embd; ++j) out[j] = static_cast<float>(v[j] / std::sqrt(norm));
  return out;
}

std::vector<float> floats(const json& list) {
  std::vector<float> out;
  for (const auto& x : list) out.push_back(x.get<float>());
  return out;
}

double norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

::testing::AssertionResult close(const std::vector<float>& expected, const std::vector<float>& got, float tol = 1e-5f) {
  if (expected.size() != got.size()) return ::testing::AssertionFailure() << got.size() << " values, expected " << expected.size();
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::abs(expected[i] - got[i]) <= tol)) {
      return ::testing::AssertionFailure() << "value " << i << ": " << got[i] << ", expected " << expected[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// RFC 4648 base64, then little-endian float32 values.
std::vector<float> decode_base64_floats(const std::string& text) {
  std::string bytes;
  uint32_t buffer = 0;
  int bits = 0;
  for (char c : text) {
    int v;
    if (c >= 'A' && c <= 'Z') v = c - 'A';
    else if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
    else if (c >= '0' && c <= '9') v = c - '0' + 52;
    else if (c == '+') v = 62;
    else if (c == '/') v = 63;
    else if (c == '=') break;
    else {
      ADD_FAILURE() << "not base64: " << c;
      return {};
    }
    buffer = (buffer << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes += static_cast<char>((buffer >> bits) & 0xFF);
    }
  }
  EXPECT_EQ(bytes.size() % 4, 0u);
  std::vector<float> out(bytes.size() / 4);
  for (size_t i = 0; i < out.size(); ++i) {
    uint32_t u = 0;
    for (int b = 3; b >= 0; --b) u = (u << 8) | static_cast<unsigned char>(bytes[4 * i + static_cast<size_t>(b)]);
    std::memcpy(&out[i], &u, 4);
  }
  return out;
}

class EmbeddingsTest : public test::InProcessServerTest {
 protected:
  std::vector<fs::path> required_models() const override { return {qwen3(), test::tiny_q8_model()}; }

  void SetUp() override {
    InProcessServerTest::SetUp();
    if (IsSkipped()) return;
    dir_ = fs::temp_directory_path() / ("m40-embeddings-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    // As Qwen3-Embedding's files: last-token pooling over a text that ends in EOS.
    last_ = copy(3, "qwen3-embed-last", true);
    mean_ = copy(1, "qwen3-embed-mean", false);
    cls_ = copy(2, "qwen3-embed-cls", false);
    rank_ = copy(4, "qwen3-rank", false);
    vocab_ = std::make_unique<tokenizer::Vocab>(tokenizer::Vocab::from_file(last_.string()));
    server::ServerOptions o;
    o.allow_paths = true;  // requests name the other copies by path
    o.n_ctx = kCtx;
    o.parallel = 2;
    start_server(o, last_);
  }
  void TearDown() override {
    InProcessServerTest::TearDown();
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  fs::path copy(uint32_t pooling, const std::string& name, bool add_eos) const {
    return test::copy_model(qwen3(), dir_ / (name + ".gguf"), [&](gguf::Metadata& m) {
      m.set("qwen3.pooling_type", pooling);
      if (add_eos) m.set("tokenizer.ggml.add_eos_token", true);
    });
  }
  // The tokens the server reads for `text` (the embedding copies share one vocabulary).
  std::vector<int32_t> tokens_of(const std::string& text) const {
    return vocab_->encode(text, {.add_special = true, .parse_special = true});
  }
  json post_json(const std::string& path, const json& body, int status = 200) const {
    auto r = client(60).Post(path, body.dump(), "application/json");
    if (!r) {
      ADD_FAILURE() << "no answer from " << path;
      return json();
    }
    EXPECT_EQ(r->status, status) << path << " " << body.dump().substr(0, 200) << " -> " << r->body.substr(0, 400);
    return json::parse(r->body, nullptr, false);
  }
  // The one embedding /v1/embeddings gives for `input` (a string or token ids).
  std::vector<float> openai_embedding(const json& input, const std::string& model = "") const {
    json body = {{"input", input}};
    if (!model.empty()) body["model"] = model;
    const json r = post_json("/v1/embeddings", body);
    return floats(r["data"][0]["embedding"]);
  }
  // A text of more than `n` tokens.
  std::string long_text(size_t n) const {
    std::string text;
    while (tokens_of(text).size() <= n) text += "The quick brown fox jumps over the lazy dog. ";
    return text;
  }

  static constexpr int kCtx = 64;
  fs::path dir_, last_, mean_, cls_, rank_;
  std::unique_ptr<tokenizer::Vocab> vocab_;
};

}  // namespace

TEST_F(EmbeddingsTest, OpenAIAnswersAListOfUnitVectorsWithUsage) {
  const std::vector<std::string> texts = {"Hello world", "Embeddings map text to vectors.", "a"};
  const json r = post_json("/v1/embeddings", {{"input", texts}, {"user", "someone"}});
  EXPECT_EQ(r["object"], "list");
  EXPECT_EQ(r["model"], "qwen3-embed-last");
  ASSERT_EQ(r["data"].size(), texts.size());
  int tokens = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const json& d = r["data"][i];
    EXPECT_EQ(d["object"], "embedding");
    EXPECT_EQ(d["index"], i);
    const auto v = floats(d["embedding"]);
    EXPECT_EQ(v.size(), 64u);
    EXPECT_NEAR(norm(v), 1.0, 1e-5);
    const auto ids = tokens_of(texts[i]);
    EXPECT_EQ(ids.back(), vocab_->special().eos) << "the copy appends EOS, as Qwen3-Embedding's files do";
    EXPECT_TRUE(close(reference_embedding(last_, ids, "last"), v)) << texts[i];
    tokens += static_cast<int>(ids.size());
  }
  EXPECT_EQ(r["usage"]["prompt_tokens"], tokens);
  EXPECT_EQ(r["usage"]["total_tokens"], tokens);
}

TEST_F(EmbeddingsTest, EachPoolingIsTheModelsOwn) {
  const std::string text = "Pooling turns the hidden states of every token into one vector.";
  const auto ids = tokens_of(text);  // no EOS in these copies' files: the tokens differ
  const auto plain_ids = vocab_->encode(text, {.add_special = false, .parse_special = true});
  for (const auto& [path, pooling] : {std::pair{mean_, "mean"}, std::pair{cls_, "cls"}}) {
    const auto v = openai_embedding(text, path.string());
    EXPECT_NEAR(norm(v), 1.0, 1e-5);
    EXPECT_TRUE(close(reference_embedding(path, plain_ids, pooling), v)) << pooling;
  }
  EXPECT_TRUE(close(reference_embedding(last_, ids, "last"), openai_embedding(text, last_.string())));
  // A generative model (no pooling_type) embeds by its last token, as Ollama does.
  const auto stories = test::tiny_q8_model();
  const auto story_ids =
      tokenizer::Vocab::from_file(stories.string()).encode("Once upon a time", {.add_special = true, .parse_special = true});
  EXPECT_TRUE(close(reference_embedding(stories, story_ids, "last"), openai_embedding("Once upon a time", stories.string())));
  // A reranker does not embed.
  const json refused = post_json("/v1/embeddings", {{"model", rank_.string()}, {"input", "x"}}, 400);
  EXPECT_NE(refused.dump().find("pooling_type"), std::string::npos) << refused.dump();
}

TEST_F(EmbeddingsTest, ATextAloneAndInsideABatchGetsTheSameVector) {
  const std::string text = "The same text, wherever it stands.";
  const auto alone = openai_embedding(text);
  const std::vector<std::string> batch = {"first", "second text here", text, "a fourth, longer text to read beside it", text};
  const json r = post_json("/v1/embeddings", {{"input", batch}});
  ASSERT_EQ(r["data"].size(), batch.size());
  EXPECT_TRUE(close(alone, floats(r["data"][2]["embedding"]), 1e-6f));
  EXPECT_TRUE(close(alone, floats(r["data"][4]["embedding"]), 1e-6f));
  EXPECT_FALSE(close(alone, floats(r["data"][0]["embedding"]), 1e-3f));
}

TEST_F(EmbeddingsTest, Base64DecodesToTheFloatList) {
  const json body = {{"input", {"base64 or floats", "the same values"}}};
  json b64 = body;
  b64["encoding_format"] = "base64";
  json f = body;
  f["encoding_format"] = "float";
  const json rb = post_json("/v1/embeddings", b64), rf = post_json("/v1/embeddings", f);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(rb["data"][i]["embedding"].is_string());
    const auto decoded = decode_base64_floats(rb["data"][i]["embedding"]);
    EXPECT_EQ(decoded, floats(rf["data"][i]["embedding"]));  // exactly: the float list reads back as the same floats
  }
}

TEST_F(EmbeddingsTest, TokenIdsEmbedAsTheirText) {
  const std::string text = "token ids or text";
  const auto ids = tokens_of(text);
  const auto from_text = openai_embedding(text);
  EXPECT_TRUE(close(from_text, openai_embedding(ids), 1e-6f));
  const json r = post_json("/v1/embeddings", {{"input", json::array({ids, tokens_of("another")})}});
  ASSERT_EQ(r["data"].size(), 2u);
  EXPECT_TRUE(close(from_text, floats(r["data"][0]["embedding"]), 1e-6f));
  EXPECT_EQ(r["usage"]["prompt_tokens"], ids.size() + tokens_of("another").size());
}

TEST_F(EmbeddingsTest, DimensionsKeepTheFirstValuesRenormalized) {
  const std::string text = "Matryoshka";
  const auto full = openai_embedding(text);
  for (const char* path : {"/v1/embeddings", "/api/embed"}) {
    const json r = post_json(path, {{"input", text}, {"dimensions", 16}});
    const auto v = floats(std::string(path) == "/api/embed" ? r["embeddings"][0] : r["data"][0]["embedding"]);
    ASSERT_EQ(v.size(), 16u) << path;
    EXPECT_NEAR(norm(v), 1.0, 1e-5);
    std::vector<float> expected(full.begin(), full.begin() + 16);
    const double n = norm(expected);
    for (float& x : expected) x = static_cast<float>(x / n);
    EXPECT_TRUE(close(expected, v)) << path;
    EXPECT_EQ(floats((std::string(path) == "/api/embed" ? post_json(path, {{"input", text}, {"dimensions", 64}})["embeddings"][0]
                                                        : post_json(path, {{"input", text}, {"dimensions", 64}})["data"][0]["embedding"]))
                  .size(),
              64u);
    post_json(path, {{"input", text}, {"dimensions", 65}}, 400);
    post_json(path, {{"input", text}, {"dimensions", 0}}, 400);
  }
}

TEST_F(EmbeddingsTest, BadInputIsRefused) {
  const std::string too_long = long_text(kCtx);
  struct Case {
    json body;
    const char* says;
  };
  const Case cases[] = {
      {json::object(), "'input' is required"},
      {{{"input", ""}}, "empty"},
      {{{"input", json::array()}}, "'input' must be"},
      {{{"input", json::array({"a", ""})}}, "'input[1]' is empty"},
      {{{"input", json::array({"a", 5})}}, "'input' must be"},
      {{{"input", json::array({json::array()})}}, "'input[0]' is empty"},
      {{{"input", json::array({1, 2, 100000})}}, "out of range"},
      {{{"input", json::array({json::array({1, -2})})}}, "out of range"},
      {{{"input", too_long}}, "shorten it"},
      {{{"input", "x"}, {"encoding_format", "int8"}}, "'encoding_format'"},
      {{{"input", "x"}, {"user", 5}}, "'user'"},
      {{{"input", "x"}, {"dimensions", "8"}}, "'dimensions'"},
      {{{"input", "x"}, {"embd_normalize", 1}}, "'embd_normalize'"},
      {{{"input", std::vector<std::string>(2049, "x")}}, "at most 2048"},
  };
  for (const auto& c : cases) {
    const json r = post_json("/v1/embeddings", c.body, 400);
    EXPECT_NE(r.dump().find(c.says), std::string::npos) << c.body.dump().substr(0, 100) << " -> " << r.dump();
    EXPECT_TRUE(r.contains("error") && r["error"].contains("message")) << r.dump();  // OpenAI's error shape
  }
  // The neutral values of what is refused pass.
  post_json("/v1/embeddings", {{"input", "x"}, {"embd_normalize", 2}, {"encoding_format", "float"}});
}

TEST_F(EmbeddingsTest, OllamaEmbedAnswersOllamasShape) {
  const std::vector<std::string> texts = {"Why is the sky blue?", "Why is the grass green?"};
  const json r = post_json("/api/embed", {{"input", texts}, {"keep_alive", "5m"}, {"options", {{"temperature", 0.5}}}});
  EXPECT_EQ(r["model"], "qwen3-embed-last:latest");
  ASSERT_EQ(r["embeddings"].size(), 2u);
  int tokens = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto v = floats(r["embeddings"][i]);
    EXPECT_NEAR(norm(v), 1.0, 1e-5);
    EXPECT_TRUE(close(openai_embedding(texts[i]), v, 1e-6f));
    tokens += static_cast<int>(tokens_of(texts[i]).size());
  }
  EXPECT_EQ(r["prompt_eval_count"], tokens);
  EXPECT_GT(r["total_duration"].get<int64_t>(), 0);
  EXPECT_TRUE(r.contains("load_duration"));
  // A string alone; the old /api/embeddings gives the same vector as "embedding".
  const json one = post_json("/api/embed", {{"input", texts[0]}});
  ASSERT_EQ(one["embeddings"].size(), 1u);
  const json old = post_json("/api/embeddings", {{"prompt", texts[0]}});
  EXPECT_TRUE(close(floats(one["embeddings"][0]), floats(old["embedding"]), 1e-6f));
  // Nothing to embed loads the model, as Ollama answers it.
  EXPECT_EQ(post_json("/api/embed", {{"input", json::array()}})["embeddings"], json::array());
  EXPECT_EQ(post_json("/api/embed", json::object())["embeddings"], json::array());
  EXPECT_EQ(post_json("/api/embeddings", {{"prompt", ""}})["embedding"], json::array());
}

TEST_F(EmbeddingsTest, OllamaTruncatesByDefaultKeepingTheBeginningAndTheEos) {
  const std::string text = long_text(kCtx);
  auto ids = tokens_of(text);
  ASSERT_GT(ids.size(), static_cast<size_t>(kCtx));
  ids.resize(kCtx);
  ids.back() = vocab_->special().eos;
  const auto expected = reference_embedding(last_, ids, "last");
  const json r = post_json("/api/embed", {{"input", text}});
  EXPECT_TRUE(close(expected, floats(r["embeddings"][0])));
  EXPECT_EQ(r["prompt_eval_count"], kCtx);
  EXPECT_TRUE(close(expected, floats(post_json("/api/embeddings", {{"prompt", text}})["embedding"])));
  const json refused = post_json("/api/embed", {{"input", text}, {"truncate", false}}, 400);
  EXPECT_NE(refused.dump().find("context"), std::string::npos) << refused.dump();
  EXPECT_TRUE(refused.contains("error") && refused["error"].is_string()) << refused.dump();  // Ollama's error shape
  // A text far past what the context could hold is cut before it is tokenized.
  std::string huge;
  while (huge.size() < 200000) huge += "The quick brown fox jumps over the lazy dog. ";
  EXPECT_TRUE(close(expected, floats(post_json("/api/embed", {{"input", huge}})["embeddings"][0])));
  post_json("/v1/embeddings", {{"input", huge}}, 400);
}

TEST_F(EmbeddingsTest, OllamaFieldsItDoesNotApplyAreRefusedByName) {
  const json a = post_json("/api/embed", {{"input", "x"}, {"options", {{"num_batch", 64}}}}, 400);
  EXPECT_NE(a.dump().find("'options.num_batch'"), std::string::npos) << a.dump();
  // num_gpu applies: 0 layers on a GPU runs here; layers on a GPU this
  // server does not use are refused.
  post_json("/api/embed", {{"input", "x"}, {"options", {{"num_gpu", 0}}}});
  const json g = post_json("/api/embed", {{"input", "x"}, {"options", {{"num_gpu", 4}}}}, 400);
  EXPECT_NE(g.dump().find("options.num_gpu 4 asks for layers on a GPU"), std::string::npos) << g.dump();
  const json b = post_json("/api/embeddings", {{"prompt", "x"}, {"options", {{"mirostat", 2}}}}, 400);
  EXPECT_NE(b.dump().find("'options.mirostat'"), std::string::npos) << b.dump();
  post_json("/api/embed", {{"input", json::array({"x", 1})}}, 400);
  post_json("/api/embed", {{"input", 7}}, 400);
  post_json("/api/embed", {{"input", "x"}, {"keep_alive", "soon"}}, 400);
  post_json("/api/embed", {{"input", "x"}, {"options", {{"num_ctx", 0}}}}, 400);
  // num_ctx within the loaded context bounds the text.
  const json r = post_json("/api/embed", {{"input", long_text(40)}, {"options", {{"num_ctx", 32}}}});
  EXPECT_EQ(r["prompt_eval_count"], 32);
}

// An embedding model embeds only: show says so, and generation is refused
// by name, as Ollama refuses it.
TEST_F(EmbeddingsTest, ShowNamesAnEmbeddingModel) {
  const json show = post_json("/api/show", {{"model", last_.string()}});
  const json caps = show["capabilities"];
  EXPECT_EQ(caps, json::array({"embedding"})) << caps.dump();
  const json refused = post_json("/v1/completions", {{"prompt", "Once"}, {"max_tokens", 2}}, 400);
  EXPECT_NE(refused.dump().find("does not support generate"), std::string::npos) << refused.dump();
  post_json("/api/chat", {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"stream", false}}, 400);
  EXPECT_EQ(show["model_info"]["qwen3.pooling_type"], 3);
  const json plain = post_json("/api/show", {{"model", qwen3().string()}})["capabilities"];
  EXPECT_EQ(std::find(plain.begin(), plain.end(), "embedding"), plain.end()) << plain.dump();
}

// A generative model embeds too (by its last token, as Ollama does), while
// it generates for another client.
TEST_F(EmbeddingsTest, EmbeddingsRunBesideAGeneratingStream) {
  const std::string model = qwen3().string();
  const auto alone = openai_embedding("beside a stream", model);
  json chat;
  std::thread generate([&] {
    chat = post_json("/v1/completions", {{"model", model}, {"prompt", "Once upon a time"}, {"max_tokens", 40},
                                         {"temperature", 0}, {"ignore_eos", true}});
  });
  std::vector<std::string> texts(6, "beside a stream");
  const json r = post_json("/v1/embeddings", {{"model", model}, {"input", texts}});
  generate.join();
  ASSERT_EQ(r["data"].size(), texts.size());
  for (const auto& d : r["data"]) EXPECT_TRUE(close(alone, floats(d["embedding"]), 1e-6f));
  EXPECT_EQ(chat["usage"]["completion_tokens"], 40);
}
