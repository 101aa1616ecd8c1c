#include "server/sampling_fields.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "engine/request_options.h"
#include "server/request_fields.h"

namespace m40::server {

namespace {

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

void read_sampling_fields(const json& body, engine::RequestParams& p) {
  auto& sp = p.sampler;
  int64_t seed = sp.seed == engine::kRandomSeed ? -1 : static_cast<int64_t>(sp.seed);
  engine::OptionTargets targets{sp, p.max_tokens, p.stop, seed};
  // The options table's fields (engine/request_options.h); the token limit
  // and the stop strings, which these APIs spell their own way, follow.
  for (const engine::RequestOption& o : engine::request_options()) {
    if (o.openai.empty() || o.name == "num_predict" || o.name == "stop") continue;
    const std::string field(o.openai);
    if (o.kind == engine::OptionKind::Real) {
      const auto v = get_number(body, field.c_str());
      if (!v) continue;
      if (!std::isnan(o.openai_low) && (*v < o.openai_low || *v > o.openai_high)) {
        throw HttpError{400, "'" + field + "' must be between " + number_text(o.openai_low) + " and " + number_text(o.openai_high)};
      }
      o.set_real(targets, *v);
    } else if (o.kind == engine::OptionKind::Integer) {
      const auto v = get_int(body, field.c_str());
      if (!v) continue;
      int64_t stored = 0;
      if (engine::fit_integer(o.integers, *v, stored) == engine::IntegerFit::Refused) {
        throw HttpError{400, "'" + field + "' must be between " + std::to_string(o.integers.low) + " and " +
                                 std::to_string(o.integers.high) + ", got " + std::to_string(*v)};
      }
      o.set_integer(targets, stored);
    }
  }
  sp.seed = seed < 0 ? engine::kRandomSeed : static_cast<uint64_t>(seed);
  for (const char* key : {"max_completion_tokens", "max_tokens", "n_predict"}) {  // n_predict: llama.cpp's name
    if (auto v = get_int(body, key)) {
      if (*v < -1) throw HttpError{400, std::string("'") + key + "' must be at least 0"};
      p.max_tokens = clamp_to_int32(*v);  // the context ends the answer long before int32 does
      break;
    }
  }
  p.ignore_eos = get_bool(body, "ignore_eos").value_or(false);  // llama.cpp's extra
  // llama.cpp's extra: false reads the whole prompt, cached blocks or not.
  p.cache_prompt = get_bool(body, "cache_prompt").value_or(true);
  p.stop = get_stop(body, "stop");
  if (p.stop.size() > 16) throw HttpError{400, "'stop' may hold at most 16 strings"};
  if (auto it = body.find("logit_bias"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) throw HttpError{400, "'logit_bias' must be an object of token id -> bias"};
    for (const auto& [key, value] : it->items()) {
      if (!value.is_number()) throw HttpError{400, "'logit_bias' values must be numbers"};
      try {
        sp.logit_bias.emplace_back(std::stoi(key), value.get<float>());
      } catch (const std::exception&) {
        throw HttpError{400, "'logit_bias' keys must be token ids"};
      }
    }
  }
}

}  // namespace m40::server
