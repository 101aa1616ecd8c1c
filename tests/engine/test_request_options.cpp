// The one table of generation options (engine/request_options.h) that the
// OpenAI, llama.cpp and Ollama routes and the CLI's /set parameter read.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "engine/request_options.h"

namespace m40::engine {
namespace {

TEST(RequestOptions, EveryOptionCanBeSetAndShownOnce) {
  std::set<std::string_view> names;
  SamplerParams sampler;
  int max_tokens = -1;
  std::vector<std::string> stop;
  int64_t seed = -1;
  OptionTargets t{sampler, max_tokens, stop, seed};
  for (const RequestOption& o : request_options()) {
    EXPECT_TRUE(names.insert(o.name).second) << o.name;
    EXPECT_EQ(find_request_option(o.name), &o);
    ASSERT_NE(o.show, nullptr) << o.name;
    switch (o.kind) {
      case OptionKind::Real: ASSERT_NE(o.set_real, nullptr) << o.name; o.set_real(t, 0.25); break;
      case OptionKind::Integer: ASSERT_NE(o.set_integer, nullptr) << o.name; o.set_integer(t, 7); break;
      case OptionKind::Strings: ASSERT_NE(o.set_strings, nullptr) << o.name; o.set_strings(t, {"a", "b"}); break;
    }
    const std::string shown = o.show(t);
    EXPECT_TRUE(shown == "0.25" || shown == "7" || shown == "\"a\" \"b\"") << o.name << ": " << shown;
  }
  EXPECT_EQ(find_request_option("mirostat"), nullptr);
  // Each lands where it belongs.
  EXPECT_EQ(sampler.temperature, 0.25f);
  EXPECT_EQ(sampler.top_k, 7);
  EXPECT_EQ(sampler.penalty_last_n, 7);
  EXPECT_EQ(sampler.frequency_penalty, 0.25f);
  EXPECT_EQ(max_tokens, 7);
  EXPECT_EQ(seed, 7);
  EXPECT_EQ(stop, (std::vector<std::string>{"a", "b"}));
}

TEST(RequestOptions, IntegersAreClampedOrRefusedAsTheirRangeSays) {
  int64_t stored = 0;
  const auto& num_predict = find_request_option("num_predict")->integers;
  EXPECT_EQ(fit_integer(num_predict, 10, stored), IntegerFit::Kept);
  EXPECT_EQ(stored, 10);
  EXPECT_EQ(fit_integer(num_predict, -5, stored), IntegerFit::MinusOne);
  EXPECT_EQ(stored, -1);
  EXPECT_EQ(fit_integer(num_predict, int64_t{1} << 40, stored), IntegerFit::Clamped);
  EXPECT_EQ(stored, std::numeric_limits<int32_t>::max());
  const auto& top_k = find_request_option("top_k")->integers;
  EXPECT_EQ(fit_integer(top_k, -(int64_t{1} << 40), stored), IntegerFit::ClampedLow);
  EXPECT_EQ(stored, std::numeric_limits<int32_t>::min());
  const auto& window = find_request_option("repeat_last_n")->integers;
  stored = 123;
  EXPECT_EQ(fit_integer(window, -2, stored), IntegerFit::Refused);
  EXPECT_EQ(stored, 123);  // untouched
  EXPECT_EQ(fit_integer(window, -1, stored), IntegerFit::Kept);
}

}  // namespace
}  // namespace m40::engine
