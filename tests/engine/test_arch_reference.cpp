// The CPU engine against llama.cpp's outputs on the tiny models of every
// architecture in ../shared/models/arch, dense and mixture-of-experts (random weights; its README
// says what each exercises and how exact the references are):
//  - F32 weights with an F32 KV cache against llama.cpp's plain-FP32 run
//    (variants/kvf32-fa-off) at every prompt position;
//  - the default F16 cache against llama.cpp's default run, last position;
//  - greedy continuations up to the first near-tie.
//  - every file against the float64 pass over its dequantized weights
//    (variants/py-f64, for gemma py-f64-gelu-exact): last-position logits
//    and the greedy continuation.
// Gemma's GELU: llama.cpp's CPU backend rounds it through an FP16 table,
// m40-llm computes it in FP32, so gemma is held to the exact-GELU float64
// pass tightly and to llama.cpp within the table's measured effect.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/error.h"
#include "model/loaded_model.h"
#include "reference_case.h"

using namespace m40;
using test::argmax;
using test::max_abs_diff;
using test::ModelUnderTest;

namespace {

const char* const kPrompts[] = {"once-upon-a-time", "the-old-lighthouse-keeper"};

struct ArchParam {
  std::string stem;  // e.g. tiny-qwen2-F32
};

bool is_gemma(const std::string& stem) { return stem.find("gemma") != std::string::npos; }
bool is_f32(const std::string& stem) { return stem.ends_with("-F32"); }

std::vector<ArchParam> dense_f32_models() {
  std::vector<ArchParam> out;
  for (const char* arch :
       {"qwen2", "qwen3", "gemma2", "gemma3", "phi3", "mistral3", "granite", "smollm3", "qwen3moe", "mixtral"}) {
    out.push_back({std::string("tiny-") + arch + "-F32"});
  }
  return out;
}

std::vector<ArchParam> dense_models() {
  std::vector<ArchParam> out = dense_f32_models();
  for (const char* arch : {"qwen2", "qwen3", "gemma2", "gemma3", "phi3", "qwen3moe", "mixtral"}) {
    out.push_back({std::string("tiny-") + arch + "-Q8_0"});
  }
  return out;
}

// Max |difference| allowed against llama.cpp's default run (F16 cache,
// flash attention) at the last prompt position. F32 files: llama.cpp's own
// default run differs from its FP32 run by 5e-3 to 2.2e-2 (the README);
// Q8_0 files: llama.cpp quantizes activations to 8 bits before each product,
// a dequantize-then-FP32 pass differs by 0.2 to 0.45.
float default_tolerance(const std::string& stem) { return is_f32(stem) ? 3e-2f : 0.6f; }

class ArchReference : public ::testing::TestWithParam<ArchParam> {
 protected:
  void SetUp() override {
    path_ = test::shared_model("arch/" + GetParam().stem + ".gguf");
    ref_dir_ = test::shared_model("arch/reference/" + GetParam().stem);
    if (!std::filesystem::exists(path_) || !std::filesystem::exists(ref_dir_)) GTEST_SKIP() << "shared data missing";
    model_ = std::make_unique<ModelUnderTest>(path_);
    n_vocab_ = static_cast<int>(model_->hparams.n_vocab);
  }

  // The logits of every prompt position, the whole prompt as one batch.
  std::vector<float> prompt_logits(const test::ReferenceCase& ref, backend::KvType kv, int n_ctx = 256) {
    auto be = model_->backend(kv, n_ctx);
    backend::Batch batch;
    const int n = static_cast<int>(ref.prompt.size());
    for (int i = 0; i < n; ++i) batch.add(ref.prompt[i], i, 0, true);
    std::vector<float> logits(static_cast<size_t>(n) * n_vocab_, NAN);
    be->forward(batch, logits);
    return logits;
  }

  // The float64 pass with exact GELU (the gemma files have both variants).
  std::filesystem::path float64_stem(const char* prompt) const {
    const auto exact = ref_dir_ / "variants" / "py-f64-gelu-exact";
    return (std::filesystem::exists(exact) ? exact : ref_dir_ / "variants" / "py-f64") / prompt;
  }

  std::filesystem::path path_, ref_dir_;
  std::unique_ptr<ModelUnderTest> model_;
  int n_vocab_ = 0;
};

}  // namespace

// llama.cpp's FP32 run is a tight reference for F32 files only: for Q8_0
// weights it quantizes the activations to 8 bits.
class ArchReferenceF32 : public ArchReference {};

TEST_P(ArchReferenceF32, F32CacheMatchesLlamaCppsFp32RunAtEveryPromptPosition) {
  // Gemma: the FP16 GELU table moves llama.cpp's logits by 4e-3 to 1e-2.
  const float tolerance = is_gemma(GetParam().stem) ? 2e-2f : 1e-3f;
  for (const char* prompt : kPrompts) {
    SCOPED_TRACE(prompt);
    const auto ref = test::ReferenceCase::load(ref_dir_ / "variants" / "kvf32-fa-off" / prompt);
    const auto logits = prompt_logits(ref, backend::KvType::F32);
    const auto all = ref.logits(".logits_all.bin");
    ASSERT_EQ(all.size(), logits.size());
    float worst = 0;
    for (size_t i = 0; i < ref.prompt.size(); ++i) {
      const float d = max_abs_diff(logits.data() + i * n_vocab_, all.data() + i * n_vocab_, n_vocab_);
      worst = std::max(worst, d);
      EXPECT_LE(d, tolerance) << "position " << i;
      EXPECT_EQ(argmax(logits.data() + i * n_vocab_, n_vocab_), argmax(all.data() + i * n_vocab_, n_vocab_))
          << "position " << i;
    }
    RecordProperty(std::string(prompt) + "_max_abs_diff", std::to_string(worst));
  }
}

// Against the float64 pass over the same (dequantized) weights, computing
// GELU exactly: what m40-llm computes, in FP32, without llama.cpp's 8-bit
// activations and FP16 GELU table.
TEST_P(ArchReference, MatchesTheFloat64PassAtTheLastPosition) {
  for (const char* prompt : kPrompts) {
    SCOPED_TRACE(prompt);
    const auto ref = test::ReferenceCase::load(ref_dir_ / prompt, float64_stem(prompt));
    const auto logits = prompt_logits(ref, backend::KvType::F32);
    const auto expected = ref.logits();
    ASSERT_EQ(expected.size(), static_cast<size_t>(n_vocab_));
    const float* last = logits.data() + (ref.prompt.size() - 1) * n_vocab_;
    const float d = max_abs_diff(last, expected.data(), n_vocab_);
    RecordProperty(std::string(prompt) + "_max_abs_diff", std::to_string(d));
    EXPECT_LE(d, 1e-3f);
  }
}

TEST_P(ArchReference, DefaultCacheMatchesLlamaCppsDefaultRun) {
  for (const char* prompt : kPrompts) {
    SCOPED_TRACE(prompt);
    const auto ref = test::ReferenceCase::load(ref_dir_ / prompt);
    const auto logits = prompt_logits(ref, backend::KvType::F16);
    const auto expected = ref.logits();
    ASSERT_EQ(expected.size(), static_cast<size_t>(n_vocab_));
    const float* last = logits.data() + (ref.prompt.size() - 1) * n_vocab_;
    const float d = max_abs_diff(last, expected.data(), n_vocab_);
    RecordProperty(std::string(prompt) + "_max_abs_diff", std::to_string(d));
    EXPECT_LE(d, default_tolerance(GetParam().stem));
    EXPECT_EQ(argmax(last, n_vocab_), argmax(expected.data(), n_vocab_));
  }
}

// Decoding token by token through the cache follows the float64 pass's
// greedy continuation until a step whose margin is within FP32 noise (the
// README's margins: a few steps of all 26 sequences fall below 0.1).
TEST_P(ArchReference, GreedyContinuationUpToTheFirstNearTie) {
  for (const char* prompt : kPrompts) {
    SCOPED_TRACE(prompt);
    const auto ref = test::ReferenceCase::load(ref_dir_ / prompt, float64_stem(prompt));
    auto be = model_->backend(backend::KvType::F32, 256);
    const auto c = test::compare_greedy(*be, ref, 4e-3f);  // below: a legitimate tie
    EXPECT_EQ(c.mismatch, -1) << "step " << c.mismatch << ": " << c.got << " instead of " << c.expected;
    const int compared = c.matched;
    RecordProperty(std::string(prompt) + "_steps_compared", compared);
    EXPECT_GE(compared, 8) << "too few steps compared to mean anything";
  }
}

std::string param_name(const ::testing::TestParamInfo<ArchParam>& info) {
  std::string s = info.param.stem;
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

INSTANTIATE_TEST_SUITE_P(TinyArchitectures, ArchReference, ::testing::ValuesIn(dense_models()), param_name);
INSTANTIATE_TEST_SUITE_P(TinyArchitectures, ArchReferenceF32, ::testing::ValuesIn(dense_f32_models()), param_name);

// The mixture-of-experts models load with their experts: count, used count
// and width as the README's shape table gives them.
TEST(ArchReferenceMoe, ExpertModelsLoadTheirExperts) {
  struct Case {
    const char* stem;
    uint32_t n_expert, n_used, n_ff_expert;
  };
  for (const Case c : {Case{"tiny-qwen3moe-Q8_0", 8, 2, 32}, Case{"tiny-mixtral-Q8_0", 4, 2, 64}}) {
    SCOPED_TRACE(c.stem);
    const auto path = test::shared_model(std::string("arch/") + c.stem + ".gguf");
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared data missing";
    const auto model = model::LoadedModel::open(path.string());
    EXPECT_EQ(model->hparams.n_expert, c.n_expert);
    EXPECT_EQ(model->hparams.n_expert_used, c.n_used);
    EXPECT_EQ(model->hparams.n_ff_expert, c.n_ff_expert);
    ASSERT_TRUE(model->weights.has_experts());
    for (const auto& l : model->weights.layers) {
      ASSERT_EQ(l.gate_exps.size(), c.n_expert);
      EXPECT_EQ(l.ffn_gate_inp.type, gguf::TensorType::F32);  // routers stay F32
      EXPECT_EQ(l.up_exps[1].data - l.up_exps[0].data, static_cast<ptrdiff_t>(l.up_exps[0].row_bytes * c.n_ff_expert));
      EXPECT_FALSE(l.w_gate.present());
    }
    EXPECT_TRUE(model->weights.unused_tensors.empty());
  }
}
