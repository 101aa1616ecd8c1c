// Embeddings: OpenAI's /v1/embeddings, Ollama's /api/embed and its older
// /api/embeddings. Each text becomes one embedding request on the resident
// model's scheduler (RequestParams::embed): its tokens' final hidden states
// pooled as the model's file declares (last token for a generative model,
// as Ollama does) and normalized to length 1 (engine/embedding_pooling.h);
// the texts of one request run side by side in the model's slots.
// `dimensions` keeps the first values and normalizes them again.
#include <algorithm>
#include <bit>
#include <charconv>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "engine/embedding_pooling.h"
#include "server/api_answers.h"
#include "server/generation.h"
#include "server/model_catalog.h"
#include "server/prompt_tokens.h"
#include "server/request_fields.h"
#include "server/routes.h"
#include "server/unsupported_fields.h"

namespace m40::server {

namespace {

// OpenAI's limit on the texts of one request.
constexpr size_t kMaxInputs = 2048;
// Tokens past the context tokenized before a truncated text is cut: what a
// cut through the text may have tokenized differently lies beyond them.
constexpr size_t kMarginTokens = 64;

int64_t ns(double seconds) { return static_cast<int64_t>(seconds * 1e9); }

// One text (or token list) to embed; `which` names it in errors ("input",
// "input[3]").
struct EmbeddingInput {
  std::string which;
  std::string text;
  std::vector<int32_t> tokens;  // given as token ids (OpenAI), else empty until tokenized
  bool given_as_tokens = false;
};

struct Embedding {
  std::vector<float> values;
  int tokens = 0;
};

// The tokens of one text: BOS and EOS as the vocabulary asks (the EOS
// Qwen3-Embedding's files append is the token whose hidden state
// last-token pooling takes), special tokens parsed. A text longer than the
// context is refused, or with `truncate` cut to its first n_ctx tokens
// with its EOS kept last (Ollama keeps an embedding's beginning). Long
// texts are bounded before they are tokenized (prompt_tokens.h).
std::vector<int32_t> embedding_tokens(const ResidentModel& m, const EmbeddingInput& in, int n_ctx, bool truncate) {
  const tokenizer::Vocab& vocab = *m.vocab;
  std::string_view text = in.text;
  const bool too_long = least_tokens_past_context(m.max_token_bytes, n_ctx + 1, text.size()) > 0;
  if (too_long && !truncate) {
    throw HttpError{400, in.which + " has " + std::to_string(text.size()) + " bytes, more tokens than the context of " +
                             std::to_string(n_ctx) + " holds: shorten it"};
  }
  if (too_long) {
    // Its beginning: more tokens than the context, and the margin.
    size_t cut = std::min(text.size(), (static_cast<size_t>(n_ctx) + kMarginTokens) * m.max_token_bytes);
    while (cut > 0 && cut < text.size() && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // a whole character
    text = text.substr(0, cut);
  }
  std::vector<int32_t> tokens = vocab.encode(text, tokenizer::EncodeOptions{.add_special = true, .parse_special = true});
  if (tokens.empty()) throw HttpError{400, in.which + " is empty: there is nothing to embed"};
  if (static_cast<int>(tokens.size()) > n_ctx) {
    if (!truncate) {
      throw HttpError{400, in.which + " has " + std::to_string(tokens.size()) + " tokens but the context holds " +
                               std::to_string(n_ctx) + ": shorten it"};
    }
    const auto eos = vocab.special().eos;
    const bool keep_eos = vocab.add_eos() && eos != tokenizer::kNoToken && tokens.back() == eos;
    tokens.resize(static_cast<size_t>(n_ctx));
    if (keep_eos) tokens.back() = eos;
  }
  return tokens;
}

// Embeds every input on the resident model: as many at once as it has
// slots, the next submitted as one ends (a request of many texts never
// fills the queue that other clients wait in). `n_ctx`: the request's
// context; `dimensions` 0: the model's width.
std::vector<Embedding> embed_all(ServerContext& s, const HttpRequest& req, ResidentModel& m, std::vector<EmbeddingInput>& inputs,
                                 int n_ctx, bool truncate, size_t dimensions) {
  model::PoolingType pooling;
  try {
    pooling = engine::embedding_pooling(m.model->hparams);
  } catch (const Error& e) {
    throw HttpError{400, e.what()};
  }
  const size_t n_embd = m.model->hparams.n_embd;
  if (dimensions > n_embd) {
    throw HttpError{400, "'dimensions' must be between 1 and the model's " + std::to_string(n_embd) + ", got " +
                             std::to_string(dimensions)};
  }
  for (auto& in : inputs) {
    if (in.given_as_tokens) {
      if (static_cast<int>(in.tokens.size()) > n_ctx) {
        throw HttpError{400, in.which + " has " + std::to_string(in.tokens.size()) + " tokens but the context holds " +
                                 std::to_string(n_ctx) + ": shorten it"};
      }
    } else {
      in.tokens = embedding_tokens(m, in, n_ctx, truncate);
    }
  }

  // Whatever ends this function, no request of it keeps its slot.
  struct Running {
    std::deque<std::pair<size_t, std::shared_ptr<engine::RequestStream>>> streams;
    ~Running() {
      for (auto& [i, stream] : streams) stream->cancel();
    }
  } running;
  const size_t window = static_cast<size_t>(std::max(1, m.scheduler->n_slots()));
  std::vector<Embedding> out(inputs.size());
  size_t next = 0;
  while (next < inputs.size() || !running.streams.empty()) {
    while (next < inputs.size() && running.streams.size() < window) {
      engine::RequestParams params;
      params.prompt = inputs[next].tokens;
      params.embed = pooling;
      params.cache_prompt = false;
      params.n_ctx = n_ctx;
      try {
        running.streams.emplace_back(next, submit(m, std::move(params)));
      } catch (const HttpError& e) {
        // Busy with other clients' requests: this one's own wait their turn.
        if (e.code == "queue_full" && !running.streams.empty()) break;
        if (e.status == 400) throw HttpError{400, inputs[next].which + ": " + e.message};
        throw;
      }
      ++next;
    }
    auto [i, stream] = running.streams.front();
    Completion done = collect(s, req, *stream).front();
    running.streams.pop_front();
    if (done.finish_reason == engine::FinishReason::Cancelled) {
      throw HttpError{503, "the embedding request was cancelled", "server_error"};
    }
    Embedding& e = out[i];
    e.tokens = static_cast<int>(inputs[i].tokens.size());
    e.values = dimensions > 0 && dimensions < done.embedding.size() ? engine::truncate_embedding(done.embedding, dimensions)
                                                                     : std::move(done.embedding);
  }
  return out;
}

// The shortest decimal that reads back as the same float, as a JSON number
// (0.1f is written 0.1, not 0.10000000149011612).
double json_float(float f) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, f);
  double d = f;
  if (ec == std::errc()) std::from_chars(buf, end, d);
  return d;
}

json float_list(const std::vector<float>& v) {
  json list = json::array();
  for (float f : v) list.push_back(json_float(f));
  return list;
}

// OpenAI's encoding_format "base64": the float32 values' little-endian bytes.
std::string base64_floats(const std::vector<float>& v) {
  std::string bytes(v.size() * sizeof(float), '\0');
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t bits = std::bit_cast<uint32_t>(v[i]);
    for (int b = 0; b < 4; ++b) bytes[4 * i + static_cast<size_t>(b)] = static_cast<char>((bits >> (8 * b)) & 0xFF);
  }
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t chunk = 0;
    for (size_t k = 0; k < 3; ++k) chunk = (chunk << 8) | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
    for (size_t k = 0; k < 4; ++k) out += k <= n ? kAlphabet[(chunk >> (18 - 6 * k)) & 0x3F] : '=';
  }
  return out;
}

// `dimensions`: nullopt when absent; 400 unless a positive integer.
size_t dimensions_field(const json& body) {
  const auto v = get_int(body, "dimensions");
  if (!v) return 0;
  if (*v < 1) throw HttpError{400, "'dimensions' must be at least 1, got " + std::to_string(*v)};
  return static_cast<size_t>(std::min<int64_t>(*v, int64_t{1} << 30));
}

// A token id list of OpenAI's input, checked against the vocabulary.
std::vector<int32_t> token_list(const json& list, const std::string& which, size_t n_vocab) {
  if (list.empty()) throw HttpError{400, which + " is empty: there is nothing to embed"};
  return token_ids(list, n_vocab, which);
}

bool token_ids(const json& list) {
  return list.is_array() && !list.empty() && std::all_of(list.begin(), list.end(), [](const json& t) { return t.is_number(); });
}

// OpenAI's `input`: a string, a list of strings, a list of token ids or a
// list of such lists (at most kMaxInputs texts, none empty).
std::vector<EmbeddingInput> openai_inputs(const json& body, size_t n_vocab) {
  auto it = body.find("input");
  if (it == body.end() || it->is_null()) throw HttpError{400, "'input' is required"};
  const json& input = *it;
  constexpr const char* kForms = "'input' must be a string, a list of strings, a list of token ids or a list of token id lists";
  std::vector<EmbeddingInput> out;
  if (input.is_string()) {
    if (input.get_ref<const std::string&>().empty()) throw HttpError{400, "'input' is empty: there is nothing to embed"};
    out.push_back({"'input'", input.get<std::string>(), {}, false});
    return out;
  }
  if (!input.is_array() || input.empty()) throw HttpError{400, std::string(kForms) + ", not empty"};
  if (token_ids(input)) {
    out.push_back({"'input'", "", token_list(input, "'input'", n_vocab), true});
    return out;
  }
  if (input.size() > kMaxInputs) {
    throw HttpError{400, "'input' holds " + std::to_string(input.size()) + " texts; at most " + std::to_string(kMaxInputs) +
                             " may be embedded at once"};
  }
  for (size_t i = 0; i < input.size(); ++i) {
    const json& item = input[i];
    const std::string which = "'input[" + std::to_string(i) + "]'";
    if (item.is_string()) {
      if (item.get_ref<const std::string&>().empty()) throw HttpError{400, which + " is empty: there is nothing to embed"};
      out.push_back({which, item.get<std::string>(), {}, false});
    } else if (item.is_array() && (item.empty() || token_ids(item))) {
      out.push_back({which, "", token_list(item, which, n_vocab), true});
    } else {
      throw HttpError{400, kForms};
    }
  }
  return out;
}

void handle_openai_embeddings(ServerContext& s, const HttpRequest& req, HttpResponse& res) {
  const json body = parse_body(req);
  const std::string model_ref = model_field(body);
  refuse_unimplemented_embedding_fields(body, false);
  get_string(body, "user");  // an end-user id for OpenAI's abuse monitoring: a string, and nothing to do here
  const std::string format = get_string(body, "encoding_format").value_or("float");
  if (format != "float" && format != "base64") {
    throw HttpError{400, "'encoding_format' must be \"float\" or \"base64\", got \"" + format + "\""};
  }
  const size_t dimensions = dimensions_field(body);
  if (auto it = body.find("input"); it == body.end() || it->is_null()) throw HttpError{400, "'input' is required"};

  auto lease = s.models.acquire(model_ref, std::nullopt);
  ResidentModel& m = lease->model();
  std::vector<EmbeddingInput> inputs = openai_inputs(body, m.vocab->size());
  const std::vector<Embedding> embeddings = embed_all(s, req, m, inputs, m.scheduler->n_ctx(), false, dimensions);
  json data = json::array();
  int tokens = 0;
  for (size_t i = 0; i < embeddings.size(); ++i) {
    const Embedding& e = embeddings[i];
    tokens += e.tokens;
    data.push_back({{"object", "embedding"},
                    {"index", i},
                    {"embedding", format == "base64" ? json(base64_floats(e.values)) : float_list(e.values)}});
  }
  send_json(res, {{"object", "list"},
                  {"data", std::move(data)},
                  {"model", m.name},
                  {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}});
}


std::optional<KeepAlive> request_keep_alive(const json& body) {
  try {
    return keep_alive_field(body);
  } catch (const Error& e) {
    throw HttpError{400, e.what()};
  }
}

// An Ollama request with nothing to embed loads the model (with keep_alive
// 0: unloads it), as Ollama answers one.
void load_only(ServerContext& s, std::shared_ptr<ModelLease> lease, const std::optional<KeepAlive>& keep_alive) {
  const std::string path = lease->model().path;
  lease.reset();
  if (keep_alive && keep_alive->unload_at_once()) s.models.unload_if_idle(path);
}

// /api/embed (`legacy` false: `input`, a string or a list of strings,
// every vector normalized) and /api/embeddings (`legacy`: one `prompt`).
void handle_ollama_embed(ServerContext& s, const HttpRequest& req, HttpResponse& res, bool legacy) {
  const auto received = Clock::now();
  const json body = parse_body(req);
  const std::string model_ref = model_field(body);
  const auto keep_alive = request_keep_alive(body);
  refuse_unimplemented_embedding_fields(body, true);
  std::vector<EmbeddingInput> inputs;
  if (legacy) {
    const std::string prompt = get_string(body, "prompt").value_or("");
    if (!prompt.empty()) inputs.push_back({"'prompt'", prompt, {}, false});
  } else if (auto it = body.find("input"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      if (!it->get_ref<const std::string&>().empty()) inputs.push_back({"'input'", it->get<std::string>(), {}, false});
    } else if (it->is_array()) {
      if (it->size() > kMaxInputs) {
        throw HttpError{400, "'input' holds " + std::to_string(it->size()) + " texts; at most " +
                                 std::to_string(kMaxInputs) + " may be embedded at once"};
      }
      for (size_t i = 0; i < it->size(); ++i) {
        const json& item = (*it)[i];
        const std::string which = "'input[" + std::to_string(i) + "]'";
        if (!item.is_string()) throw HttpError{400, "'input' must be a string or a list of strings"};
        if (item.get_ref<const std::string&>().empty()) throw HttpError{400, which + " is empty: there is nothing to embed"};
        inputs.push_back({which, item.get<std::string>(), {}, false});
      }
    } else {
      throw HttpError{400, "'input' must be a string or a list of strings"};
    }
  }
  const bool truncate = legacy || get_bool(body, "truncate").value_or(true);
  const size_t dimensions = legacy ? 0 : dimensions_field(body);
  const int num_ctx = ollama_num_ctx(body);

  auto lease = s.models.acquire(model_ref, keep_alive, num_ctx, ollama_num_gpu(body));
  ResidentModel& m = lease->model();
  const double load_seconds = lease->load_seconds();
  const std::string model = ollama_name(model_ref.empty() ? m.name : model_ref);
  if (inputs.empty()) {
    load_only(s, std::move(lease), keep_alive);  // `m` may be gone after this
    if (legacy) return send_json(res, {{"embedding", json::array()}});
    return send_json(res, {{"model", model}, {"embeddings", json::array()}});
  }
  engine::RequestParams asked;  // the context the request asks for, within the loaded one
  asked.n_ctx = num_ctx;
  const int n_ctx = request_context(m, asked);
  const std::vector<Embedding> embeddings = embed_all(s, req, m, inputs, n_ctx, truncate, dimensions);
  if (legacy) return send_json(res, {{"embedding", float_list(embeddings.front().values)}});
  json list = json::array();
  int tokens = 0;
  for (const Embedding& e : embeddings) {
    list.push_back(float_list(e.values));
    tokens += e.tokens;
  }
  send_json(res, {{"model", model},
                  {"embeddings", std::move(list)},
                  {"total_duration", ns(std::chrono::duration<double>(Clock::now() - received).count())},
                  {"load_duration", ns(load_seconds)},
                  {"prompt_eval_count", tokens}});
}

}  // namespace

void register_embedding_routes(ServerContext& s) {
  s.router.post("/v1/embeddings", route(s, ApiFlavor::OpenAI, [&s](const HttpRequest& req, HttpResponse& res) {
                  handle_openai_embeddings(s, req, res);
                }));
  s.router.post("/api/embed", route(s, ApiFlavor::Ollama, [&s](const HttpRequest& req, HttpResponse& res) {
                  handle_ollama_embed(s, req, res, false);
                }));
  s.router.post("/api/embeddings", route(s, ApiFlavor::Ollama, [&s](const HttpRequest& req, HttpResponse& res) {
                  handle_ollama_embed(s, req, res, true);
                }));
}

}  // namespace m40::server
