// `m40-llm tokenize MODEL TEXT` and `m40-llm detokenize MODEL ID...`: the
// model's tokenizer on its own, as llama.cpp's llama-tokenize shows it, to
// check a prompt's tokens or read back a sequence of ids.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/error.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"
#include "store/model_ref.h"

namespace m40::cli {

namespace {

using Json = nlohmann::ordered_json;
using tokenizer::TokenId;
using tokenizer::Vocab;

struct TokenizeOptions {
  std::string model;
  std::string text;
  std::string file;
  bool text_given = false;
  bool pieces = false;
  bool no_bos = false;
  bool special = false;
  bool json = false;
};

struct DetokenizeOptions {
  std::string model;
  std::vector<int64_t> ids;
  bool special = false;
  bool json = false;
};

std::string read_text(const std::string& path) {
  if (path == "-") return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Vocab load_vocab(const std::string& path) {
  Vocab vocab = Vocab::from_file(store::resolve_model(path));
  for (const std::string& w : vocab.warnings()) std::fprintf(stderr, "warning: %s\n", w.c_str());
  return vocab;
}

std::string hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  for (unsigned char c : bytes) {
    s += kDigits[c >> 4];
    s += kDigits[c & 15];
  }
  return s;
}

// A piece for the terminal: printable UTF-8 as it is; control characters,
// quotes, backslashes and bytes that are no whole character escaped.
std::string escaped(std::string_view piece) {
  std::string s;
  for (size_t i = 0; i < piece.size();) {
    const auto c = static_cast<unsigned char>(piece[i]);
    const size_t len = tokenizer::utf8::valid_length(piece, i);
    if (c == '\n') {
      s += "\\n";
    } else if (c == '\t') {
      s += "\\t";
    } else if (c == '\r') {
      s += "\\r";
    } else if (c == '\\' || c == '\'') {
      s += '\\';
      s += static_cast<char>(c);
    } else if (len == 0 || c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      s += buf;
      i += 1;
      continue;
    } else {
      s.append(piece.data() + i, len);
      i += len;
      continue;
    }
    i += 1;
  }
  return s;
}

// What JSON can hold of some bytes: invalid UTF-8 becomes U+FFFD (the hex
// field beside it has the exact bytes).
std::string json_safe(std::string_view bytes) {
  if (tokenizer::utf8::is_valid(bytes)) return std::string(bytes);
  std::string s;
  tokenizer::utf8::sanitize(bytes, s);
  return s;
}

int run_tokenize(const TokenizeOptions& o) {
  if (o.text_given == !o.file.empty()) throw Error("give the TEXT to tokenize or --file FILE (one of them)");
  const std::string text = o.file.empty() ? o.text : read_text(o.file);
  const Vocab vocab = load_vocab(o.model);
  const tokenizer::EncodeOptions encode{.add_special = !o.no_bos, .parse_special = o.special};
  const std::vector<TokenId> ids = vocab.encode(text, encode);

  if (o.json) {
    Json tokens = Json::array();
    for (TokenId id : ids) {
      const std::string& piece = vocab.piece(id, true);
      tokens.push_back({{"id", id}, {"piece", json_safe(piece)}, {"piece_hex", hex(piece)}});
    }
    const Json out = {{"model", o.model},
                      {"tokenizer", vocab.model_name()},
                      {"pre", vocab.pre_name()},
                      {"add_special", encode.add_special},
                      {"parse_special", encode.parse_special},
                      {"n_tokens", ids.size()},
                      {"ids", ids},
                      {"tokens", tokens}};
    std::printf("%s\n", out.dump(2, ' ', false, Json::error_handler_t::replace).c_str());
  } else if (o.pieces) {
    for (TokenId id : ids) std::printf("%6d -> '%s'\n", id, escaped(vocab.piece(id, true)).c_str());
  } else {
    std::string line;
    for (TokenId id : ids) {
      if (!line.empty()) line += ' ';
      line += std::to_string(id);
    }
    std::printf("%s\n", line.c_str());
  }
  return 0;
}

int run_detokenize(const DetokenizeOptions& o) {
  const Vocab vocab = load_vocab(o.model);
  std::vector<TokenId> ids;
  ids.reserve(o.ids.size());
  for (int64_t id : o.ids) {
    if (id < 0 || id >= static_cast<int64_t>(vocab.size())) {
      throw Error("token id " + std::to_string(id) + " is out of range: the vocabulary has " +
                  std::to_string(vocab.size()) + " tokens (ids 0.." + std::to_string(vocab.size() - 1) + ")");
    }
    ids.push_back(static_cast<TokenId>(id));
  }
  const std::string text = vocab.decode(ids, {.remove_special = false, .render_special = o.special});
  if (o.json) {
    const Json out = {{"model", o.model}, {"ids", ids}, {"text", json_safe(text)}, {"text_hex", hex(text)}};
    std::printf("%s\n", out.dump(2, ' ', false, Json::error_handler_t::replace).c_str());
  } else {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
  }
  return 0;
}

}  // namespace

void register_tokenize_command(CLI::App& app) {
  auto t = std::make_shared<TokenizeOptions>();
  CLI::App* tokenize = app.add_subcommand(
      "tokenize",
      "Print the token ids of TEXT under MODEL's tokenizer (BOS/EOS added as the model asks).\n"
      "Example: m40-llm tokenize model.gguf \"Hello world\" --pieces");
  tokenize->add_option("MODEL", t->model, "A store name or a GGUF file (a vocabulary-only file is enough)")
      ->required();
  CLI::Option* text = tokenize->add_option("TEXT", t->text, "The text to tokenize");
  tokenize->add_option("--file", t->file, "Read the text from this file ('-': standard input)");
  tokenize->add_flag("--pieces", t->pieces, "One line per token: id and the text it stands for");
  tokenize->add_flag("--no-bos", t->no_bos, "Add no BOS/EOS token, whatever the model asks");
  tokenize->add_flag("--special", t->special, "Parse special tokens in the text (<s>, <|im_start|>, ...)");
  tokenize->add_flag("--json", t->json, "One JSON document: ids and each token's piece");
  tokenize->callback([t, text] {
    t->text_given = text->count() > 0;
    set_command_action([t] { return run_tokenize(*t); });
  });

  auto d = std::make_shared<DetokenizeOptions>();
  CLI::App* detokenize = app.add_subcommand(
      "detokenize", "Print the text of token ids under MODEL's tokenizer.\nExample: m40-llm detokenize model.gguf 1 15043 3186");
  detokenize->add_option("MODEL", d->model, "A store name or a GGUF file (a vocabulary-only file is enough)")
      ->required();
  detokenize->add_option("ID", d->ids, "Token ids")->required();
  detokenize->add_flag("--special", d->special, "Write control tokens (<s>, <|im_end|>, ...) as their text");
  detokenize->add_flag("--json", d->json, "One JSON document: the text and its bytes in hex");
  detokenize->callback([d] { set_command_action([d] { return run_detokenize(*d); }); });
}

}  // namespace m40::cli
