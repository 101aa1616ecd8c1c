#include "server/sampling_fields.h"

#include <string>

#include "server/request_fields.h"

namespace m40::server {

void read_sampling_fields(const json& body, engine::RequestParams& p) {
  auto& sp = p.sampler;
  if (auto v = get_number(body, "temperature")) {
    if (*v < 0 || *v > 2) throw HttpError{400, "'temperature' must be between 0 and 2"};
    sp.temperature = static_cast<float>(*v);
  }
  if (auto v = get_number(body, "top_p")) {
    if (*v < 0 || *v > 1) throw HttpError{400, "'top_p' must be between 0 and 1"};
    sp.top_p = static_cast<float>(*v);
  }
  if (auto v = get_int(body, "top_k")) sp.top_k = clamp_to_int32(*v);  // past the vocabulary: no limit
  if (auto v = get_number(body, "min_p")) sp.min_p = static_cast<float>(*v);
  if (auto v = get_number(body, "repeat_penalty")) sp.repeat_penalty = static_cast<float>(*v);
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    if (auto v = get_number(body, key)) {
      if (*v < -2 || *v > 2) throw HttpError{400, std::string("'") + key + "' must be between -2 and 2"};
      (std::string(key) == "presence_penalty" ? sp.presence_penalty : sp.frequency_penalty) = static_cast<float>(*v);
    }
  }
  if (auto v = get_int(body, "seed")) sp.seed = *v < 0 ? engine::kRandomSeed : static_cast<uint64_t>(*v);
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
