// What a model needs on the GPU, computed before anything is allocated:
// weights in their storage types, the FP16 or Q8_0 KV cache (a pool of blocks,
// backends/kv_blocks.h) and the activation scratch. A plan over the budget is refused with the numbers.
#pragma once

#include <cstdint>
#include <string>

#include "backends/backend.h"
#include "backends/cuda/layer_kernels.h"
#include "model/hparams.h"
#include "model/row_split.h"
#include "model/weights.h"

namespace m40::cuda {

struct MemoryPlan {
  uint64_t weights = 0;
  uint64_t kv_cache = 0;
  uint64_t scratch = 0;
  uint64_t reserve = 0;  // CUDA context, graphs and fragmentation headroom
  uint64_t total() const { return weights + kv_cache + scratch + reserve; }
  std::string describe() const;  // "4.07 GiB (weights 3.80 GiB, KV cache ..., scratch ...)"
};

struct PlanShape {
  int n_ctx = 0;
  int n_seq = 1;
  int max_batch = 512;      // tokens per forward chunk
  int max_logit_rows = 32;  // output-head rows computed at once
  int kv_blocks = 0;        // KV pool blocks of kKvBlockSize positions; 0: n_seq * kv_blocks_for(n_ctx)
  backend::KvType kv_type = backend::KvType::F16;  // 2 bytes a value, or 34 per 32 for Q8_0
  // The layers on this GPU ({0, 0}: all): a stage of a model split over
  // devices holds those layers' weights and K/V, the token embedding where
  // it begins at layer 0, the output norm and head where it ends at the last.
  backend::LayerRange layers{};
  // A shard of a row split (model/row_split.h): its slices of each layer's
  // matrices and its heads' K/V, the token embedding, the output head on
  // shard 0 only, and the exchange's buffers (ShardExchange).
  model::RowShard shard{};
  // The pool's blocks, kv_blocks or its default.
  int kv_pool_blocks() const;
};

// The CUDA cache format of a KV type (F32 has none: CudaBackend refuses it).
inline KvFormat kv_format(backend::KvType type) {
  return type == backend::KvType::Q8_0 ? KvFormat::Q8_0 : KvFormat::F16;
}

MemoryPlan plan_memory(const model::ModelHparams& hparams, const model::ModelWeights& weights, const PlanShape& shape);

// Throws m40::Error saying what is needed against what is available when
// the plan does not fit in `available` bytes.
void check_plan_fits(const MemoryPlan& plan, uint64_t available, const std::string& where);

}  // namespace m40::cuda
