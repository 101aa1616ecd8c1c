// Writes what llama.cpp computes for a prompt of token ids: the logits at
// every position, float32 little-endian, [n_tokens][n_vocab], with an F32
// KV cache and flash attention off on the CPU (llama.cpp's plain-FP32 run).
// Built against llama.cpp @ 3f545be (../shared/peers), not part of
// m40-llm's build; README.md beside it has the commands.
//
//   llama_logits MODEL.gguf OUT.bin ID...
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s MODEL.gguf OUT.bin ID...\n", argv[0]);
    return 2;
  }
  std::vector<llama_token> ids;
  for (int i = 3; i < argc; ++i) ids.push_back(static_cast<llama_token>(std::atoi(argv[i])));
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (model == nullptr) return 1;
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 64;
  cp.n_batch = 64;
  cp.n_ubatch = 64;
  cp.n_threads = 1;
  cp.n_threads_batch = 1;
  cp.type_k = GGML_TYPE_F32;
  cp.type_v = GGML_TYPE_F32;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) return 1;
  llama_batch batch = llama_batch_init(static_cast<int32_t>(ids.size()), 0, 1);
  for (size_t i = 0; i < ids.size(); ++i) {
    batch.token[i] = ids[i];
    batch.pos[i] = static_cast<llama_pos>(i);
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = 1;
  }
  batch.n_tokens = static_cast<int32_t>(ids.size());
  if (llama_decode(ctx, batch) != 0) return 1;
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  std::FILE* out = std::fopen(argv[2], "wb");
  if (out == nullptr) return 1;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::fwrite(llama_get_logits_ith(ctx, static_cast<int32_t>(i)), sizeof(float), n_vocab, out);
  }
  std::fclose(out);
  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
