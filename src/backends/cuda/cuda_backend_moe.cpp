// The mixture-of-experts FFN of a layer on the GPU (moe.h has the kernels):
// the router (with a shared expert's gate row), routing and grouping, the
// chosen experts' grouped products, a shared expert's dense FFN, and the
// combination joined to the residual stream.
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/device.h"
#include "backends/cuda/moe.h"

namespace m40::cuda {

bool CudaBackend::enqueue_moe_ffn(const LayerOnDevice& w, int n, const float* next_norm) {
  const auto& hp = hparams_;
  const int n_expert = static_cast<int>(hp.n_expert);
  const int k = static_cast<int>(hp.n_expert_used);
  const int n_embd = static_cast<int>(hp.n_embd);
  const int64_t n_ff = hp.n_ff_expert;
  const int slots = n * k;
  const bool shared_expert = w.shexp_down.rows > 0;
  if (shared_expert) {  // its gate's row read with the router's
    enqueue_xn_products(w.router_and_shexp_gate, {{&w.router, router_logits_}, {&w.shexp_gate_inp, shexp_logit_}}, n);
  } else {
    matmul(w.router, xn_, n, router_logits_, nullptr, stream_);
  }
  stage_timer_.mark(stream_, "moe_router");
  const gguf::TensorType expert_type = w.gate_up_exps.rows > 0 ? w.gate_up_exps.type : w.gate_exps.type;
  const int item_tokens =
      expert_item_tokens(n, k, n_expert, expert_tile_share(expert_type, current_multiprocessor_count()));
  const int n_items = max_expert_items(n, k, n_expert, item_tokens);
  route_and_group(router_logits_, n, n_expert, k, hp.desc->expert_weights_renormalized, item_tokens, n_items,
                  expert_ids_, expert_weights_, sorted_slots_, slot_rows_, expert_items_, stream_);
  // Items of one token read it where it is; larger ones need their
  // tokens' rows side by side.
  const bool x_by_token = item_tokens == 1;
  if (!x_by_token) gather_expert_rows(xn_, sorted_slots_, k, slots, n_embd, expert_x_, stream_);
  const float* x = x_by_token ? xn_ : expert_x_;
  stage_timer_.mark(stream_, "moe_route");
  if (w.gate_up_exps.rows > 0) {
    grouped_matmul(w.gate_up_exps, n_expert, x, x_by_token, item_tokens, expert_items_, n_items, expert_gate_up_,
                   stream_);
    stage_timer_.mark(stream_, "moe_gate_up");
    silu_mul_rows(expert_gate_up_, slots, static_cast<int>(n_ff), expert_act_, stream_);
  } else {
    float* gate = expert_gate_up_;
    float* up = expert_gate_up_ + slots * n_ff;
    grouped_matmul(w.gate_exps, n_expert, x, x_by_token, item_tokens, expert_items_, n_items, gate, stream_);
    grouped_matmul(w.up_exps, n_expert, x, x_by_token, item_tokens, expert_items_, n_items, up, stream_);
    stage_timer_.mark(stream_, "moe_gate_up");
    silu_mul(gate, up, expert_act_, slots * n_ff, stream_);
  }
  stage_timer_.mark(stream_, "ffn_activation");
  grouped_matmul(w.down_exps, n_expert, expert_act_, false, item_tokens, expert_items_, n_items, expert_out_, stream_);
  stage_timer_.mark(stream_, "moe_down");
  if (shared_expert) {  // a dense FFN on xn_, its gate and up through gate_ and up_
    enqueue_xn_products(w.shexp_gate_up, {{&w.shexp_gate, gate_}, {&w.shexp_up, up_}}, n);
    silu_mul(gate_, up_, gate_, int64_t{n} * w.shexp_gate.rows, stream_);
    matmul(w.shexp_down, gate_, n, shexp_out_, nullptr, stream_);
    stage_timer_.mark(stream_, "moe_shared_expert");
  }
  const SharedExpertOutput shared{shared_expert ? shexp_out_ : nullptr, shared_expert ? shexp_logit_ : nullptr};
  return join_branch(
      [&](float* y, const float* residual, const NextNorm& next) {
        combine_experts(expert_out_, slot_rows_, expert_weights_, n, k, n_embd, shared, y, residual, stream_, next,
                        hp.rms_eps);
      },
      nullptr, w.post_ffn_norm, n, "moe_combine", next_norm, true);
}

}  // namespace m40::cuda
