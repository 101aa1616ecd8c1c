#include "backends/cuda/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "backends/cuda/device_memory.h"
#include "backends/kv_blocks.h"
#include "common/error.h"

namespace m40::cuda {

namespace {

std::string gib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

uint64_t weight_bytes(const model::WeightView& w) {
  if (!w.present()) return 0;
  // 1-D weights (norms, biases) are widened to FP32 on upload.
  return Arena::aligned(w.rows == 1 ? w.cols * sizeof(float) : w.row_bytes * w.rows);
}

}  // namespace

void* Arena::take(size_t bytes) {
  const size_t size = aligned(bytes);
  if (used_ + size > memory_.bytes()) {
    throw Error("GPU arena exhausted: " + std::to_string(used_ + size) + " of " + std::to_string(memory_.bytes()) +
                " bytes (the memory plan undercounted)");
  }
  void* p = static_cast<char*>(memory_.data()) + used_;
  used_ += size;
  return p;
}

std::string MemoryPlan::describe() const {
  return gib(total()) + " (weights " + gib(weights) + ", KV cache " + gib(kv_cache) + ", scratch " + gib(scratch) +
         ", reserve " + gib(reserve) + ")";
}

MemoryPlan plan_memory(const model::ModelHparams& model_hp, const model::ModelWeights& w, const PlanShape& shape) {
  MemoryPlan plan;
  // The dimensions one shard computes with (the model's for no split).
  const model::ModelHparams hp = model::shard_hparams(model_hp, shape.shard);
  const backend::LayerRange stage = backend::resolve_layers(shape.layers, static_cast<int>(hp.n_layer));
  const bool holds_input = stage.first == 0;
  const bool holds_output = stage.end == static_cast<int>(hp.n_layer) && shape.shard.index == 0;
  // The rope factors: only the set the context size selects goes up.
  const model::WeightView* rope_factors = w.rope_factors(hp, static_cast<uint32_t>(std::max(shape.n_ctx, 0)));
  // A tied head reads the token embedding.
  const bool embedding = holds_input || (holds_output && w.tied_output);
  plan.weights = (embedding ? weight_bytes(w.token_embd) : 0) + (holds_output ? weight_bytes(w.output_norm) : 0) +
                 (rope_factors != nullptr ? weight_bytes(*rope_factors) : 0) +
                 (holds_output && !w.tied_output ? weight_bytes(w.output) : 0);
  // A shard's slices (model/row_split.h): its rows as views, its columns of
  // the output and down products; the whole model's for no split.
  const model::ShardRows r = model::shard_rows(model_hp, shape.shard);
  const auto columns = [](const model::WeightView& v, uint64_t first, uint64_t end) {
    return v.present() ? Arena::aligned(v.rows * model::column_slice(v, first, end).bytes) : 0;
  };
  for (int li = stage.first; li < stage.end; ++li) {
    const model::LayerWeights& whole = w.layers[static_cast<size_t>(li)];
    model::LayerWeights sliced;  // plans run often (layers_that_fit): the whole model's layers are not copied
    if (!shape.shard.whole()) sliced = model::row_slices(whole, r);
    const model::LayerWeights& l = shape.shard.whole() ? whole : sliced;
    for (const model::WeightView* v :
         {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.bq, &l.bk, &l.bv, &l.q_norm, &l.k_norm, &l.bo, &l.post_attn_norm,
          &l.ffn_norm, &l.w_gate, &l.w_up, &l.post_ffn_norm}) {
      plan.weights += weight_bytes(*v);
    }
    plan.weights += columns(l.wo, r.q_first, r.q_end) + columns(l.w_down, r.ff_first, r.ff_end);
    // Expert tensors go up whole (every expert's matrix, back to back).
    plan.weights += weight_bytes(l.ffn_gate_inp);
    for (const model::WeightView* v : {&l.gate_inp_shexp, &l.gate_shexp, &l.up_shexp, &l.down_shexp}) {
      plan.weights += weight_bytes(*v);
    }
    for (const auto* slices : {&l.gate_exps, &l.up_exps, &l.down_exps}) plan.weights += weight_bytes(model::stacked_slices(*slices));
  }
  // K and V, FP16 or Q8_0 (34 bytes per 32 values), every layer and pool row
  // (kKvBlockSize per block).
  plan.kv_cache = 2ull * static_cast<uint64_t>(stage.size()) * static_cast<uint64_t>(shape.kv_pool_blocks()) *
                  backend::kKvBlockSize *
                  kv_row_bytes(kv_format(shape.kv_type), static_cast<int>(hp.kv_dim()));
  // Activations of one chunk (FP32): x, xn, a layer slice's hidden states
  // between steps, q, k, v, attention out, gate, up (of the dense FFN or a
  // shared expert); the logits of the output-head rows;
  // token/position/sequence ids; the sequences' block tables.
  const uint64_t dense_ff = std::max(hp.n_ff, hp.n_ff_shared_expert);
  const uint64_t per_token = 3ull * hp.n_embd + 2ull * hp.q_dim() + 2ull * hp.kv_dim() + 2ull * dense_ff;
  plan.scratch = per_token * shape.max_batch * sizeof(float) +
                 static_cast<uint64_t>(shape.max_logit_rows) * (hp.n_vocab + hp.n_embd) * sizeof(float) +
                 3ull * shape.max_batch * sizeof(int32_t) +
                 static_cast<uint64_t>(std::max(shape.n_seq, 0)) * backend::kv_blocks_for(std::max(shape.n_ctx, 0)) *
                     sizeof(int32_t) +  // the block tables
                 16 * Arena::kAlignment;
  if (!shape.shard.whole()) {  // ShardExchange::buffer_floats
    plan.scratch += Arena::aligned((2ull + static_cast<uint64_t>(shape.shard.count)) * shape.max_batch * hp.n_embd * sizeof(float));
  }
  if (hp.has_experts()) {
    // Per token the router's logits; per slot (token x chosen expert) its
    // id, weight, two sort indices and work item (16 bytes), the gathered
    // x and the expert's output (n_embd each), gate, up and their
    // activation (n_ff_expert each); per token a shared expert's gate logit
    // and output.
    const uint64_t slots = uint64_t{hp.n_expert_used} * shape.max_batch;
    plan.scratch += uint64_t{hp.n_expert} * shape.max_batch * sizeof(float) + slots * (4 * sizeof(int32_t) + 16) +
                    slots * (2ull * hp.n_embd + 3ull * hp.n_ff_expert) * sizeof(float) + 10 * Arena::kAlignment;
    if (hp.n_ff_shared_expert != 0) plan.scratch += (1ull + hp.n_embd) * shape.max_batch * sizeof(float) + 2 * Arena::kAlignment;
  }
  plan.reserve = 256ull << 20;
  return plan;
}

int PlanShape::kv_pool_blocks() const {
  return kv_blocks > 0 ? kv_blocks : std::max(n_seq, 0) * backend::kv_blocks_for(std::max(n_ctx, 0));
}

void check_plan_fits(const MemoryPlan& plan, uint64_t available, const std::string& where) {
  if (plan.total() > available) {
    throw Error("the model does not fit on " + where + ": it needs " + plan.describe() + " but " + gib(available) +
                " is available; use a smaller quantization, a smaller --ctx or fewer parallel sequences, or --cpu");
  }
}

}  // namespace m40::cuda
