// Grammar-constrained decoding: the cost of TokenConstraint::mask() plus
// accept() per generated token, over whole JSON documents (and an
// arithmetic expression) tokenized by real vocabularies: Qwen2 (151k
// byte-level BPE tokens) and Llama (32k SentencePiece tokens).
//
// The limit: a mask should cost at most ~5% of a decode step at batch 1,
// about 200 us per token. "warm" runs a new sequence on a grammar seen
// before (its per-state token tables are shared, as for repeated requests
// with one schema); "cold" uses a grammar never seen (the tables are built
// during the document, as for the first request with a new schema).
//
//   bench_grammar [--vocab-dir DIR] [google benchmark flags]
//
// sec/token is the mean over the document (u = microseconds); worst_us is
// the slowest single token of the last run.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "grammar/gbnf_builder.h"
#include "grammar/grammar.h"
#include "grammar/token_constraint.h"
#include "grammar/token_vocabulary.h"
#include "tokenizer/vocab.h"

namespace {

namespace fs = std::filesystem;
using m40::grammar::TokenConstraint;
using m40::grammar::TokenVocabulary;
using json = nlohmann::ordered_json;

std::string g_vocab_dir = std::string(M40_SHARED_DIR) + "/models/vocab";

// An object of the kind chat clients ask for: nested objects, arrays,
// strings with escapes and non-ASCII text, numbers, booleans, null.
const char* const kObjectDocument = R"doc({
  "id": "req-8f14e45f",
  "customer": {"name": "Zoë Müller", "email": "zoe.mueller@example.org", "tier": "gold", "since": "2019-04-01"},
  "items": [
    {"sku": "A-1001", "title": "Espresso cups (set of 4)", "qty": 2, "price": 24.5},
    {"sku": "B-2203", "title": "Stovetop kettle, 1.7 l", "qty": 1, "price": 39.99},
    {"sku": "C-0042", "title": "Gift wrap \"deluxe\"", "qty": 1, "price": 3}
  ],
  "shipping": {"method": "express", "address": {"street": "Hauptstraße 12", "city": "Köln", "zip": "50667", "country": "DE"}},
  "paid": true,
  "coupon": null,
  "notes": "Leave at the door; ring twice.\nThanks!"
})doc";

const char* const kOrderSchema = R"({
  "$defs": {
    "address": {
      "type": "object",
      "properties": {"street": {"type": "string"}, "city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                     "country": {"enum": ["DE", "FR", "US", "GB"]}},
      "required": ["street", "city", "zip", "country"]
    },
    "item": {
      "type": "object",
      "properties": {"sku": {"type": "string"}, "title": {"type": "string", "maxLength": 80}, "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                     "price": {"type": "number", "minimum": 0}},
      "required": ["sku", "title", "qty", "price"]
    }
  },
  "type": "object",
  "properties": {
    "id": {"type": "string"},
    "customer": {
      "type": "object",
      "properties": {"name": {"type": "string"}, "email": {"type": "string", "format": "email"},
                     "tier": {"enum": ["bronze", "silver", "gold"]}, "since": {"type": "string", "format": "date"}},
      "required": ["name", "email", "tier"]
    },
    "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 20},
    "shipping": {"type": "object", "properties": {"method": {"enum": ["standard", "express"]}, "address": {"$ref": "#/$defs/address"}},
                 "required": ["method", "address"]},
    "paid": {"type": "boolean"},
    "coupon": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    "notes": {"type": "string", "maxLength": 500}
  },
  "required": ["id", "customer", "items", "shipping", "paid"],
  "additionalProperties": false
})";

const char* const kArithmeticGrammar = R"gbnf(root ::= expr
expr ::= term (ws ("+" | "-") ws term)*
term ::= factor (ws ("*" | "/") ws factor)*
factor ::= number | "(" ws expr ws ")" | "-" factor
number ::= [0-9]+ ("." [0-9]+)?
ws ::= [ ]?
)gbnf";

const char* const kArithmeticDocument =
    "(12.5 + 3) * (7 - 2) / 4 + ((1 + 2) * (3 + 4) - 5) / (6.25 * (8 - 3)) - -17 * 2 + (100 / (25 - 5)) * "
    "((9 - 4) * (2 + 2)) - 3.14159 * (2.71828 + 1.41421) / (1.73205 - 0.57735) + 42";

struct Loaded {
  std::unique_ptr<m40::tokenizer::Vocab> tokenizer;
  std::shared_ptr<const TokenVocabulary> vocab;
};

const Loaded* load(const std::string& name) {
  static std::vector<std::pair<std::string, std::unique_ptr<Loaded>>> cache;
  for (const auto& [n, l] : cache) {
    if (n == name) return l.get();
  }
  const fs::path path = fs::path(g_vocab_dir) / ("ggml-vocab-" + name + ".gguf");
  std::unique_ptr<Loaded> loaded;
  if (fs::exists(path)) {
    loaded = std::make_unique<Loaded>();
    loaded->tokenizer = std::make_unique<m40::tokenizer::Vocab>(m40::tokenizer::Vocab::from_file(path.string()));
    const auto& v = *loaded->tokenizer;
    std::vector<std::string> pieces(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v.is_control(static_cast<int32_t>(i))) pieces[i] = v.piece(static_cast<int32_t>(i));
    }
    loaded->vocab = std::make_shared<TokenVocabulary>(std::move(pieces), v.end_of_generation_tokens());
  }
  cache.emplace_back(name, std::move(loaded));
  return cache.back().second.get();
}

// The document as a model would write it after a prompt (SentencePiece's
// leading space removed by tokenizing after a newline).
std::vector<int32_t> tokens_of(const Loaded& l, const std::string& text) {
  const m40::tokenizer::EncodeOptions options{.add_special = false};
  auto spell = [&](const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t id : ids) s += l.vocab->piece(id);
    return s;
  };
  std::vector<int32_t> ids = l.tokenizer->encode(text, options);
  if (spell(ids) == text) return ids;
  ids = l.tokenizer->encode("\n" + text, options);
  std::string prefix;
  size_t k = 0;
  while (k < ids.size() && prefix != "\n" && prefix != " \n") prefix += l.vocab->piece(ids[k++]);
  ids.erase(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k));
  return spell(ids) == text ? ids : std::vector<int32_t>{};
}

void run_document(benchmark::State& state, const std::string& vocab_name, const std::string& gbnf,
                  const std::string& document, bool cold) {
  const Loaded* l = load(vocab_name);
  if (l == nullptr) {
    state.SkipWithError(("vocabulary " + vocab_name + " not found in " + g_vocab_dir).c_str());
    return;
  }
  const std::vector<int32_t> ids = tokens_of(*l, document);
  if (ids.empty()) {
    state.SkipWithError("the document does not tokenize back to itself");
    return;
  }
  std::vector<float> logits(l->vocab->size());
  auto warm_grammar = m40::grammar::parse_gbnf(gbnf);
  {
    TokenConstraint warm_up(warm_grammar, l->vocab);  // builds the shared tables
    for (int32_t id : ids) {
      warm_up.mask(logits);
      warm_up.accept(id);
    }
  }
  int64_t run = 0;
  double worst_us = 0;
  for (auto _ : state) {
    state.PauseTiming();
    // A comment makes the text, and so the tables, new.
    auto grammar = cold ? m40::grammar::parse_gbnf(gbnf + "# run " + std::to_string(run++) + "\n") : warm_grammar;
    state.ResumeTiming();
    TokenConstraint c(grammar, l->vocab);
    worst_us = 0;
    for (int32_t id : ids) {
      const auto t0 = std::chrono::steady_clock::now();
      std::fill(logits.begin(), logits.end(), 0.0f);
      c.mask(logits);
      if (logits[static_cast<size_t>(id)] != 0.0f) {
        state.SkipWithError("the mask removed a token of the document");
        return;
      }
      c.accept(id);
      worst_us = std::max(worst_us, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    benchmark::DoNotOptimize(logits.data());
  }
  state.counters["tokens"] = static_cast<double>(ids.size());
  state.counters["sec/token"] =
      benchmark::Counter(static_cast<double>(ids.size()), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.counters["worst_us"] = worst_us;
}

void register_all() {
  const std::string object_gbnf = m40::grammar::json_object_gbnf();
  const std::string schema_gbnf = m40::grammar::json_schema_to_gbnf(json::parse(kOrderSchema));
  // The schema document: the object above, which the schema accepts.
  for (const char* vocab : {"qwen2", "llama-spm"}) {
    for (bool cold : {false, true}) {
      const std::string suffix = std::string("/") + vocab + (cold ? "/cold" : "/warm");
      benchmark::RegisterBenchmark(("json_object" + suffix).c_str(), run_document, vocab, object_gbnf, kObjectDocument, cold)
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("json_schema" + suffix).c_str(), run_document, vocab, schema_gbnf, kObjectDocument, cold)
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("gbnf_arithmetic" + suffix).c_str(), run_document, vocab, kArithmeticGrammar,
                                   kArithmeticDocument, cold)
          ->Unit(benchmark::kMillisecond);
    }
  }
}

// Writes the grammars and documents to DIR (NAME.gbnf, NAME.txt), for
// bench/peer/llama_grammar_bench.cpp to walk the same ones in llama.cpp.
void dump_inputs(const std::string& dir) {
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(fs::path(dir) / name, std::ios::binary) << text;
  };
  write("json_object.gbnf", m40::grammar::json_object_gbnf());
  write("json_object.txt", kObjectDocument);
  write("json_schema.gbnf", m40::grammar::json_schema_to_gbnf(json::parse(kOrderSchema)));
  write("json_schema.txt", kObjectDocument);
  write("gbnf_arithmetic.gbnf", kArithmeticGrammar);
  write("gbnf_arithmetic.txt", kArithmeticDocument);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--vocab-dir") == 0 && i + 1 < argc) {
      g_vocab_dir = argv[++i];
    } else if (std::strcmp(argv[i], "--dump") == 0 && i + 1 < argc) {
      dump_inputs(argv[++i]);
      return 0;
    } else {
      args.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  benchmark::AddCustomContext("limit", "about 200 us per token (5% of a batch-1 decode step)");
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
