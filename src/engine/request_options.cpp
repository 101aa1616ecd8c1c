#include "engine/request_options.h"

#include <algorithm>
#include <cstdio>

namespace m40::engine {

namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();

std::string real_text(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(v));
  return buf;
}

const RequestOption kOptions[] = {
    {.name = "seed", .openai = "seed", .kind = OptionKind::Integer, .help = "Random number seed (-1: random)",
     .set_integer = [](OptionTargets& t, int64_t v) { t.seed = v; },
     .show = [](const OptionTargets& t) { return std::to_string(t.seed); }},
    // Past int32 the context ends the answer first.
    {.name = "num_predict", .openai = "max_tokens", .kind = OptionKind::Integer,
     .help = "Max number of tokens to predict (-1: until the end)",
     .integers = {.low = -1, .high = kInt32Max, .clamp_high = true, .negative_is_minus_one = true},
     .set_integer = [](OptionTargets& t, int64_t v) { t.max_tokens = static_cast<int>(v); },
     .show = [](const OptionTargets& t) { return std::to_string(t.max_tokens); }},
    // 0 or less is off; past int32 (past any vocabulary) is no limit.
    {.name = "top_k", .openai = "top_k", .kind = OptionKind::Integer, .help = "Pick from top k num of tokens",
     .integers = {.low = kInt32Min, .high = kInt32Max, .clamp_high = true, .clamp_low = true},
     .set_integer = [](OptionTargets& t, int64_t v) { t.sampler.top_k = static_cast<int32_t>(v); },
     .show = [](const OptionTargets& t) { return std::to_string(t.sampler.top_k); }},
    {.name = "top_p", .openai = "top_p", .kind = OptionKind::Real, .help = "Pick token based on sum of probabilities",
     .openai_low = 0, .openai_high = 1,
     .set_real = [](OptionTargets& t, double v) { t.sampler.top_p = static_cast<float>(v); },
     .show = [](const OptionTargets& t) { return real_text(t.sampler.top_p); }},
    {.name = "min_p", .openai = "min_p", .kind = OptionKind::Real, .help = "Pick token based on top token probability * min_p",
     .set_real = [](OptionTargets& t, double v) { t.sampler.min_p = static_cast<float>(v); },
     .show = [](const OptionTargets& t) { return real_text(t.sampler.min_p); }},
    {.name = "temperature", .openai = "temperature", .kind = OptionKind::Real, .help = "Set creativity level (0: greedy)",
     .openai_low = 0, .openai_high = 2,
     .set_real = [](OptionTargets& t, double v) { t.sampler.temperature = static_cast<float>(v); },
     .show = [](const OptionTargets& t) { return real_text(t.sampler.temperature); }},
    {.name = "repeat_penalty", .openai = "repeat_penalty", .kind = OptionKind::Real, .help = "How strongly to penalize repetitions",
     .set_real = [](OptionTargets& t, double v) { t.sampler.repeat_penalty = static_cast<float>(v); },
     .show = [](const OptionTargets& t) { return real_text(t.sampler.repeat_penalty); }},
    // -1 every token, 0 off; a window past int32 is past any context.
    {.name = "repeat_last_n", .openai = "repeat_last_n", .kind = OptionKind::Integer,
     .help = "Set how far back to look for repetitions", .integers = {.low = -1, .high = kInt32Max, .clamp_high = true},
     .set_integer = [](OptionTargets& t, int64_t v) { t.sampler.penalty_last_n = static_cast<int32_t>(v); },
     .show = [](const OptionTargets& t) { return std::to_string(t.sampler.penalty_last_n); }},
    {.name = "presence_penalty", .openai = "presence_penalty", .kind = OptionKind::Real,
     .help = "Penalty for any earlier occurrence", .openai_low = -2, .openai_high = 2,
     .set_real = [](OptionTargets& t, double v) { t.sampler.presence_penalty = static_cast<float>(v); },
     .show = [](const OptionTargets& t) { return real_text(t.sampler.presence_penalty); }},
    {.name = "frequency_penalty", .openai = "frequency_penalty", .kind = OptionKind::Real,
     .help = "Penalty per earlier occurrence", .openai_low = -2, .openai_high = 2,
     .set_real = [](OptionTargets& t, double v) { t.sampler.frequency_penalty = static_cast<float>(v); },
     .show = [](const OptionTargets& t) { return real_text(t.sampler.frequency_penalty); }},
    {.name = "stop", .openai = "stop", .kind = OptionKind::Strings, .help = "Set the stop parameters",
     .set_strings = [](OptionTargets& t, std::vector<std::string> v) { t.stop = std::move(v); },
     .show = [](const OptionTargets& t) {
       std::string stops;
       for (const auto& s : t.stop) stops += (stops.empty() ? "\"" : " \"") + s + "\"";
       return stops.empty() ? std::string("(none)") : stops;
     }},
};

}  // namespace

std::span<const RequestOption> request_options() { return kOptions; }

const RequestOption* find_request_option(std::string_view name) {
  for (const RequestOption& o : kOptions) {
    if (o.name == name) return &o;
  }
  return nullptr;
}

IntegerFit fit_integer(const IntegerRange& range, int64_t value, int64_t& stored) {
  IntegerFit fit = IntegerFit::Kept;
  if (range.negative_is_minus_one && value < 0) {
    if (value != -1) fit = IntegerFit::MinusOne;
    value = -1;
  }
  if (value > range.high && range.clamp_high) {
    fit = IntegerFit::Clamped;
    value = range.high;
  }
  if (value < range.low && range.clamp_low) {
    fit = IntegerFit::ClampedLow;
    value = range.low;
  }
  if (value < range.low || value > range.high) return IntegerFit::Refused;
  stored = value;
  return fit;
}

}  // namespace m40::engine
