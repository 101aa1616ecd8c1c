// Expert routing as llama.cpp's build_moe_ffn computes it for qwen3moe and
// Mixtral: softmax over every router logit, the top k by probability (ties
// to the lower expert index, as ggml's CPU argsort leaves them), and the
// chosen probabilities renormalized to sum 1 (qwen2moe: left as they are).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backends/cpu/moe.h"
#include "common/error.h"

using namespace m40;

TEST(MoeRouting, TopTwoOfFourRenormalized) {
  // softmax(ln 1, ln 4, ln 2, ln 3) = (0.1, 0.4, 0.2, 0.3): top 2 = experts 1
  // and 3, weights 0.4/0.7 and 0.3/0.7.
  const float logits[4] = {0.0f, std::log(4.0f), std::log(2.0f), std::log(3.0f)};
  cpu::ExpertChoice out[2];
  cpu::route_experts(logits, 4, 2, true, out);
  EXPECT_EQ(out[0].expert, 1);
  EXPECT_EQ(out[1].expert, 3);
  EXPECT_NEAR(out[0].weight, 4.0f / 7.0f, 1e-6f);
  EXPECT_NEAR(out[1].weight, 3.0f / 7.0f, 1e-6f);
}

TEST(MoeRouting, TiesGoToTheLowerExpertIndex) {
  // Experts 2, 4 and 5 tie for first: 2 and 4 are chosen, in that order,
  // with equal weights.
  const float logits[6] = {0.5f, -1.0f, 2.0f, 1.0f, 2.0f, 2.0f};
  cpu::ExpertChoice out[2];
  cpu::route_experts(logits, 6, 2, true, out);
  EXPECT_EQ(out[0].expert, 2);
  EXPECT_EQ(out[1].expert, 4);
  EXPECT_FLOAT_EQ(out[0].weight, 0.5f);
  EXPECT_FLOAT_EQ(out[1].weight, 0.5f);

  // A tie for the last place: the lower index of the two gets it.
  const float tied_last[4] = {3.0f, 1.0f, 0.0f, 1.0f};
  cpu::route_experts(tied_last, 4, 2, true, out);
  EXPECT_EQ(out[0].expert, 0);
  EXPECT_EQ(out[1].expert, 1);
  const double e = std::exp(-2.0);  // p1 / p0
  EXPECT_NEAR(out[0].weight, 1.0 / (1.0 + e), 1e-6);
  EXPECT_NEAR(out[1].weight, e / (1.0 + e), 1e-6);
}

TEST(MoeRouting, AllExpertsUsedWeighByTheirSoftmax) {
  // k = n: renormalizing a full softmax leaves it as it is.
  const float logits[3] = {1.0f, 2.0f, 3.0f};
  cpu::ExpertChoice out[3];
  cpu::route_experts(logits, 3, 3, true, out);
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_EQ(out[0].expert, 2);
  EXPECT_EQ(out[2].expert, 0);
  EXPECT_NEAR(out[0].weight, std::exp(3.0) / z, 1e-6);
  EXPECT_NEAR(out[1].weight, std::exp(2.0) / z, 1e-6);
  EXPECT_NEAR(out[2].weight, std::exp(1.0) / z, 1e-6);
}

TEST(MoeRouting, TopOneWeighsOne) {
  const float logits[3] = {-4.0f, 7.0f, 6.5f};
  cpu::ExpertChoice out[1];
  cpu::route_experts(logits, 3, 1, true, out);
  EXPECT_EQ(out[0].expert, 1);
  EXPECT_FLOAT_EQ(out[0].weight, 1.0f);
}

TEST(MoeRouting, RefusesAnImpossibleK) {
  const float logits[2] = {0.0f, 0.0f};
  cpu::ExpertChoice out[3];
  EXPECT_THROW(cpu::route_experts(logits, 2, 3, true, out), Error);
  EXPECT_THROW(cpu::route_experts(logits, 2, 0, true, out), Error);
}

TEST(MoeRouting, WithoutRenormalizingTheWeightsAreTheSoftmaxProbabilities) {
  // qwen2moe: softmax(ln 1, ln 4, ln 2, ln 3) = (0.1, 0.4, 0.2, 0.3), top 2
  // = experts 1 and 3 with 0.4 and 0.3.
  const float logits[4] = {0.0f, std::log(4.0f), std::log(2.0f), std::log(3.0f)};
  cpu::ExpertChoice out[2];
  cpu::route_experts(logits, 4, 2, false, out);
  EXPECT_EQ(out[0].expert, 1);
  EXPECT_EQ(out[1].expert, 3);
  EXPECT_NEAR(out[0].weight, 0.4f, 1e-6f);
  EXPECT_NEAR(out[1].weight, 0.3f, 1e-6f);
}
