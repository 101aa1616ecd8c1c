// The generation options every front end takes, in one table: the name
// Ollama's `options` and the CLI's `/set parameter` use, the field OpenAI's
// and llama.cpp's request bodies spell it as, its kind, the values it
// accepts, and where it goes. The OpenAI, llama.cpp and Ollama routes and
// the interactive chat all read their options through it; each front end
// keeps only its own defaults and its own way of reading a value (JSON or
// typed text).
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampler.h"

namespace m40::engine {

// What the options write. `seed` is the option's value as given: negative
// asks for a fresh random seed (kRandomSeed in the sampler).
struct OptionTargets {
  SamplerParams& sampler;
  int& max_tokens;
  std::vector<std::string>& stop;
  int64_t& seed;
};

enum class OptionKind { Real, Integer, Strings };

// An integer option's values. Past `high` it is `high` when `clamp_high`
// (top_k and num_predict past int32: the vocabulary or the context ends
// them first), below `low` it is `low` when `clamp_low`; a negative value
// is -1 when `negative_is_minus_one`
// (num_predict: any negative is "no limit"); otherwise outside [low, high]
// is refused.
struct IntegerRange {
  int64_t low = std::numeric_limits<int64_t>::min();
  int64_t high = std::numeric_limits<int64_t>::max();
  bool clamp_high = false;
  bool clamp_low = false;  // below `low` it is `low` (top_k: 0 or less is off)
  bool negative_is_minus_one = false;
};

struct RequestOption {
  std::string_view name;    // Ollama's options key and the CLI's /set parameter name
  std::string_view openai;  // the OpenAI / llama.cpp body field; "" where those APIs have none
  OptionKind kind;
  std::string_view help;    // what /set parameter lists
  IntegerRange integers = {};  // Integer options
  // The range OpenAI's API documents for it (refused outside, on the OpenAI
  // and llama.cpp routes); NaN: none.
  double openai_low = std::numeric_limits<double>::quiet_NaN();
  double openai_high = std::numeric_limits<double>::quiet_NaN();
  void (*set_real)(OptionTargets&, double) = nullptr;
  void (*set_integer)(OptionTargets&, int64_t) = nullptr;  // a value already within `integers`
  void (*set_strings)(OptionTargets&, std::vector<std::string>) = nullptr;
  std::string (*show)(const OptionTargets&) = nullptr;     // the value as /show parameters prints it
};

// Every option, in the order /set parameter lists them.
std::span<const RequestOption> request_options();
// By its Ollama / CLI name; nullptr for none.
const RequestOption* find_request_option(std::string_view name);

// An integer as `range` takes it: kept, mapped to -1 or clamped to an end
// as it says (`stored` then holds it), or refused.
enum class IntegerFit { Kept, MinusOne, Clamped, ClampedLow, Refused };
IntegerFit fit_integer(const IntegerRange& range, int64_t value, int64_t& stored);

}  // namespace m40::engine
