// llama.cpp's grammar sampler on the same walk bench_grammar --walk times:
// a document tokenized by the vocabulary, and per token the grammar's
// apply() over every token of the vocabulary (the logits of a whole
// decode step) plus accept() of the document's token. Built against a
// llama.cpp checkout by scripts/grammar-peer-bench.sh; it prints one line
// per run in the same form as bench_grammar --walk:
//
//   walk VOCAB GRAMMAR_FILE tokens=N mean_us=M worst_us=W
//
//   llama_grammar_bench VOCAB.gguf GRAMMAR.gbnf DOCUMENT.txt [RUNS]
#include <llama.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

std::string read_file(const char* path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path);
    std::exit(1);
  }
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s VOCAB.gguf GRAMMAR.gbnf DOCUMENT.txt [RUNS]\n", argv[0]);
    return 2;
  }
  const int runs = argc > 4 ? std::atoi(argv[4]) : 5;
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.vocab_only = true;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (model == nullptr) return 1;
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int n_vocab = llama_vocab_n_tokens(vocab);
  const std::string gbnf = read_file(argv[2]);
  const std::string document = read_file(argv[3]);

  // The document as a model writes it after a prompt: tokenized after a
  // newline, whose tokens are dropped (a SentencePiece vocabulary would
  // otherwise start it with a space), as bench_grammar does.
  const std::string text = "\n" + document;
  std::vector<llama_token> tokens(text.size() + 16);
  const int count = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), tokens.data(),
                                   static_cast<int32_t>(tokens.size()), false, false);
  if (count < 0) return 1;
  tokens.resize(static_cast<size_t>(count));
  std::string prefix;
  size_t skip = 0;
  while (skip < tokens.size() && prefix != "\n" && prefix != " \n") {
    char piece[256];
    const int len = llama_token_to_piece(vocab, tokens[skip++], piece, sizeof piece, 0, false);
    prefix.append(piece, static_cast<size_t>(std::max(len, 0)));
  }
  tokens.erase(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(skip));
  const int n = static_cast<int>(tokens.size());

  std::vector<llama_token_data> candidates(static_cast<size_t>(n_vocab));
  for (int run = 0; run < runs; ++run) {
    llama_sampler* grammar = llama_sampler_init_grammar(vocab, gbnf.c_str(), "root");
    if (grammar == nullptr) {
      std::fprintf(stderr, "llama.cpp did not parse %s\n", argv[2]);
      return 1;
    }
    double total = 0;
    double worst = 0;
    for (llama_token t : tokens) {
      for (int i = 0; i < n_vocab; ++i) candidates[static_cast<size_t>(i)] = {i, 0.0f, 0.0f};
      llama_token_data_array cur = {candidates.data(), candidates.size(), -1, false};
      const auto start = std::chrono::steady_clock::now();
      llama_sampler_apply(grammar, &cur);
      llama_sampler_accept(grammar, t);
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
      total += us;
      worst = std::max(worst, us);
      if (candidates[static_cast<size_t>(t)].logit == -INFINITY) {
        std::fprintf(stderr, "llama.cpp's grammar refused token %d of the document\n", t);
        return 1;
      }
    }
    std::printf("walk %s %s tokens=%d mean_us=%.1f worst_us=%.1f\n", argv[1], argv[2], n, total / n, worst);
    llama_sampler_free(grammar);
  }
  llama_model_free(model);
  return 0;
}
