#include "server/unsupported_fields.h"

#include <algorithm>
#include <string>

#include "engine/request_options.h"
#include "server/http_error.h"

namespace m40::server {

namespace {

using json = nlohmann::ordered_json;

// Present with a value that asks for something.
bool used(const json& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_string()) return !v.get_ref<const std::string&>().empty();
  if (v.is_array() || v.is_object()) return !v.empty();
  return true;
}

struct Rule {
  const char* field;
  const char* why;
  bool (*asks)(const json& value) = used;
};

[[noreturn]] void refuse(const std::string& field, const char* why) {
  throw HttpError{400, "'" + field + "' is not supported yet: " + why};
}

void apply(const json& body, std::initializer_list<Rule> rules) {
  for (const Rule& r : rules) {
    auto it = body.find(r.field);
    if (it != body.end() && r.asks(*it)) refuse(r.field, r.why);
  }
}

bool more_than_one(const json& v) { return !v.is_null() && !(v.is_number_integer() && v.get<int64_t>() == 1); }
bool a_tool_choice(const json& v) { return used(v) && !(v.is_string() && (v == "none" || v == "auto")); }
bool not_text_only(const json& v) { return used(v) && v != json::array({"text"}); }

}  // namespace

void refuse_unimplemented_openai_fields(const json& body, bool chat) {
  apply(body, {
                  {"functions", "the deprecated function calling is not built: use 'tools'"},
                  {"function_call", "the deprecated function calling is not built: use 'tool_choice'", a_tool_choice},
                  {"audio", "the models are text-only"},
                  {"modalities", "the models are text-only", not_text_only},
                  {"prediction", "predicted outputs are not built"},
                  {"web_search_options", "web search is not built"},
                  {"reasoning_effort", "effort levels are not built; thinking is on or off: chat_template_kwargs.enable_thinking"},
                  {"store", "stored completions are not built"},
              });
  if (chat) return;
  apply(body, {
                  {"tools", "tools are for /v1/chat/completions"},
                  {"tool_choice", "tools are for /v1/chat/completions", a_tool_choice},
                  {"best_of", "best_of is not built: use n", more_than_one},
              });
}

void refuse_unimplemented_llama_cpp_fields(const json& body, bool infill) {
  // Numbers whose neutral value is what llama.cpp does without them.
  static const auto nonzero = [](const json& v) { return v.is_number() && v.get<double>() != 0; };
  static const auto positive = [](const json& v) { return v.is_number() && v.get<double>() > 0; };
  static const auto not_one = [](const json& v) { return v.is_number() && v.get<double>() != 1; };
  static const auto a_slot = [](const json& v) { return v.is_number() && v.get<double>() >= 0; };
  apply(body, {
                  {"post_sampling_probs", "probabilities after the samplers are not built: n_probs gives the model's"},
                  {"mirostat", "mirostat sampling is not built", nonzero},
                  {"typical_p", "locally typical sampling is not built", not_one},
                  {"dynatemp_range", "dynamic temperature is not built", nonzero},
                  {"dry_multiplier", "DRY sampling is not built", nonzero},
                  {"xtc_probability", "XTC sampling is not built", nonzero},
                  {"top_n_sigma", "top-n-sigma sampling is not built", positive},
                  {"samplers", "the sampler order is fixed (docs/sampling.md)"},
                  {"n_keep", "the context is never shifted: a prompt over it is refused", positive},
                  {"id_slot", "requests are not pinned to slots", a_slot},
                  {"lora", "LoRA adapters are not built"},
                  {"response_fields", "the answer's fields are fixed"},
                  {"return_tokens", "token ids in the answer are not built"},
                  {"t_max_predict_ms", "time limits are not built: use n_predict", positive},
                  {"n_cmpl", "one answer per request on this route (/v1/completions has n)", more_than_one},
                  {"multimodal_data", "the models are text-only"},
                  {"image_data", "the models are text-only"},
              });
  if (!infill) return;
  apply(body, {
                  {"input_extra", "extra context files are not built: put them in input_prefix"},
                  {"n_indent", "indentation limits are not built", positive},
              });
}

void refuse_unimplemented_ollama_fields(const json& body) {
  apply(body, {
                  {"template", "the model's own chat template is used"},
              });
  auto it = body.find("options");
  if (it == body.end() || !it->is_object()) return;
  // The options the server applies: the options table's, num_ctx (the
  // context) and num_gpu (the layers on GPUs).
  std::string applied;
  for (const engine::RequestOption& o : engine::request_options()) applied += std::string(o.name) + ", ";
  applied += "num_ctx, num_gpu";
  for (const auto& [key, value] : it->items()) {
    if (value.is_null() || key == "num_ctx" || key == "num_gpu" || engine::find_request_option(key) != nullptr) continue;
    throw HttpError{400, "'options." + key + "' is not supported by this server; the options it applies are " + applied};
  }
}

void refuse_unimplemented_embedding_fields(const json& body, bool ollama) {
  apply(body, {
                  {"embd_normalize", "embeddings are normalized to Euclidean length 1 (embd_normalize 2)",
                   [](const json& v) { return !v.is_null() && !(v.is_number_integer() && v.get<int64_t>() == 2); }},
              });
  if (!ollama) return;
  auto it = body.find("options");
  if (it == body.end() || it->is_null()) return;
  if (!it->is_object()) throw HttpError{400, "'options' must be an object"};
  // num_ctx and num_gpu apply; the generation options are accepted and
  // have no effect on an embedding, as in Ollama.
  for (const auto& [key, value] : it->items()) {
    if (value.is_null() || key == "num_ctx" || key == "num_gpu" || engine::find_request_option(key) != nullptr) continue;
    throw HttpError{400, "'options." + key + "' is not supported by this server; an embedding applies num_ctx and "
                         "num_gpu (the sampling options have no effect on it)"};
  }
}

}  // namespace m40::server
