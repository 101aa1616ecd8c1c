#include "model/weights.h"

#include <unordered_set>

#include "common/error.h"
#include "quant/dequantize.h"

namespace m40::model {

namespace {

std::string shape_string(const std::vector<uint64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

class WeightFinder {
 public:
  explicit WeightFinder(const gguf::File& file) : file_(file) {}

  // A tensor of shape [cols, rows] (ggml order); rows = 1 means a vector.
  WeightView require(const std::string& name, uint64_t cols, uint64_t rows) const {
    const gguf::TensorInfo* t = file_.find_tensor(name);
    if (t == nullptr) throw Error("the model file lacks tensor '" + name + "' (incomplete or not a llama model)");
    return check(*t, cols, rows);
  }
  // A 3-D tensor [cols, rows, n_slices] (ggml order: one [cols, rows]
  // matrix per expert), as one view per slice.
  std::vector<WeightView> require_slices(const std::string& name, uint64_t cols, uint64_t rows,
                                         uint64_t n_slices) const {
    const gguf::TensorInfo* t = file_.find_tensor(name);
    if (t == nullptr) throw Error("the model file lacks tensor '" + name + "' (incomplete model)");
    const std::vector<uint64_t> expected{cols, rows, n_slices};
    std::vector<uint64_t> found = t->dims;
    while (found.size() < 3) found.push_back(1);
    if (cols == 0 || rows == 0 || n_slices == 0 || found != expected) {
      throw Error("tensor '" + t->name + "' has shape " + shape_string(t->dims) + ", expected " +
                  shape_string(expected) + " from the model's hyperparameters");
    }
    if (!quant::can_dequantize(t->type)) {
      throw Error("tensor '" + t->name + "' has type " + std::string(gguf::tensor_type_name(t->type)) +
                  ", which m40-llm cannot compute with yet");
    }
    const uint64_t row_bytes = t->byte_size / (rows * n_slices);
    const uint8_t* data = file_.tensor_data(*t).data();
    std::vector<WeightView> slices(n_slices);
    for (uint64_t e = 0; e < n_slices; ++e) {
      WeightView& v = slices[e];
      v.name = t->name + " (expert " + std::to_string(e) + ")";
      v.type = t->type;
      v.cols = cols;
      v.rows = rows;
      v.row_bytes = row_bytes;
      v.data = data + e * rows * row_bytes;
    }
    used_.insert(t->name);
    return slices;
  }
  WeightView optional(const std::string& name, uint64_t cols, uint64_t rows) const {
    const gguf::TensorInfo* t = file_.find_tensor(name);
    return t == nullptr ? WeightView{} : check(*t, cols, rows);
  }

 private:
  WeightView check(const gguf::TensorInfo& t, uint64_t cols, uint64_t rows) const {
    if (cols == 0 || rows == 0) {
      // Only inconsistent hyperparameters ask for an empty matrix; a file that
      // stores one would pass the shape check and leave nothing to compute with.
      throw Error("tensor '" + t.name + "' would be an empty " + shape_string({cols, rows}) +
                  " matrix: the model's hyperparameters are inconsistent");
    }
    const std::vector<uint64_t> expected = rows == 1 ? std::vector<uint64_t>{cols} : std::vector<uint64_t>{cols, rows};
    std::vector<uint64_t> found = t.dims;
    while (found.size() > 1 && found.back() == 1) found.pop_back();  // [n, 1] is a vector too
    if (found != expected) {
      throw Error("tensor '" + t.name + "' has shape " + shape_string(t.dims) + ", expected " +
                  shape_string(expected) + " from the model's hyperparameters");
    }
    if (!quant::can_dequantize(t.type)) {
      throw Error("tensor '" + t.name + "' has type " + std::string(gguf::tensor_type_name(t.type)) +
                  ", which m40-llm cannot compute with yet");
    }
    WeightView v;
    v.name = t.name;
    v.type = t.type;
    v.cols = cols;
    v.rows = rows;
    v.row_bytes = t.byte_size / rows;
    v.data = file_.tensor_data(t).data();
    used_.insert(t.name);
    return v;
  }

 public:
  // The file's tensors that no require() or optional() found, in file order.
  std::vector<std::string> unused() const {
    std::vector<std::string> names;
    for (const auto& t : file_.tensors()) {
      if (!used_.contains(t.name)) names.push_back(t.name);
    }
    return names;
  }

 private:
  const gguf::File& file_;
  mutable std::unordered_set<std::string> used_;
};

}  // namespace

WeightView row_range(const WeightView& w, uint64_t first, uint64_t count, const std::string& part) {
  WeightView v = w;
  v.name = w.name + " (" + part + ")";
  v.rows = count;
  v.data = w.data + first * w.row_bytes;
  return v;
}

WeightView element_range(const WeightView& w, uint64_t first, uint64_t count, const std::string& part) {
  const uint64_t element_bytes = w.row_bytes / w.cols;
  if (gguf::tensor_type_traits(w.type).block_size != 1) {
    throw Error("tensor '" + w.name + "' has type " + std::string(gguf::tensor_type_name(w.type)) +
                ", which m40-llm cannot take apart by element (a fused bias, or a row split's share of one)");
  }
  WeightView v = w;
  v.name = w.name + " (" + part + ")";
  v.cols = count;
  v.row_bytes = count * element_bytes;
  v.data = w.data + first * element_bytes;
  return v;
}

ModelWeights ModelWeights::load(const gguf::File& file, const ModelHparams& hp) {
  const Architecture& arch = *hp.desc;
  if (!arch.runnable()) {
    throw Error("unsupported architecture " + hp.architecture + ": " + std::string(arch.not_runnable));
  }
  if (hp.n_expert == 0 && file.find_tensor("blk.0.ffn_gate_inp.weight") != nullptr) {
    throw Error("the model file has expert routers (ffn_gate_inp) but " + arch_key(hp.architecture, "expert_count") +
                " is missing or 0");
  }
  if (hp.n_expert > 0 && (arch.fused_gate_up || arch.post_norms || arch.activation != FfnActivation::Silu)) {
    throw Error("unsupported model: " + hp.architecture + " with mixture-of-experts layers");
  }
  WeightFinder find(file);
  ModelWeights w;
  w.token_embd = find.require("token_embd.weight", hp.n_embd, hp.n_vocab);
  w.output_norm = find.require("output_norm.weight", hp.n_embd, 1);
  if (!arch.output_always_tied) w.output = find.optional("output.weight", hp.n_embd, hp.n_vocab);
  if (!w.output.present()) {
    w.output = w.token_embd;
    w.tied_output = true;
  }
  w.rope_freqs = find.optional("rope_freqs.weight", hp.n_rot / 2, 1);
  w.rope_factors_short = find.optional("rope_factors_short.weight", hp.n_rot / 2, 1);
  w.rope_factors_long = find.optional("rope_factors_long.weight", hp.n_rot / 2, 1);
  if (hp.rope_scaling == RopeScaling::LongRope && !w.rope_factors_short.present() && !w.rope_factors_long.present()) {
    throw Error(arch_key(hp.architecture, "rope.scaling.type") +
                " is longrope, but the file has neither rope_factors_short.weight nor rope_factors_long.weight");
  }
  if (w.rope_factors_short.present() != w.rope_factors_long.present()) {
    throw Error("the file has only one of rope_factors_short.weight and rope_factors_long.weight; LongRoPE needs both");
  }

  // The fewest tensors a layer has (norms, Q, K, V, output, gate, up, down;
  // fused Q/K/V and gate/up count once). Checked before the layers are
  // allocated, so a crafted block_count cannot make a small file allocate
  // gigabytes.
  const bool fused_qkv = file.find_tensor("blk.0.attn_qkv.weight") != nullptr;
  const uint64_t tensors_per_layer = 9 - (fused_qkv ? 2 : 0) - (arch.fused_gate_up ? 1 : 0);
  if (hp.n_layer > file.tensors().size() / tensors_per_layer) {
    throw Error(arch_key(hp.architecture, "block_count") + " is " + std::to_string(hp.n_layer) +
                ", but the file holds only " + std::to_string(file.tensors().size()) + " tensors, fewer than the " +
                std::to_string(tensors_per_layer) + " each layer needs (corrupt metadata or a truncated model)");
  }
  const uint64_t q_dim = hp.q_dim(), kv_dim = hp.kv_dim();
  w.layers.resize(hp.n_layer);
  for (uint32_t i = 0; i < hp.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[i];
    l.attn_norm = find.require(p + "attn_norm.weight", hp.n_embd, 1);
    // Q, K and V as three tensors or one (as llama.cpp's create_tensor_qkv
    // accepts for every architecture).
    if (file.find_tensor(p + "attn_qkv.weight") != nullptr) {
      const WeightView qkv = find.require(p + "attn_qkv.weight", hp.n_embd, q_dim + 2 * kv_dim);
      l.wq = row_range(qkv, 0, q_dim, "Q");
      l.wk = row_range(qkv, q_dim, kv_dim, "K");
      l.wv = row_range(qkv, q_dim + kv_dim, kv_dim, "V");
      const WeightView bias = find.optional(p + "attn_qkv.bias", q_dim + 2 * kv_dim, 1);
      if (bias.present()) {
        l.bq = element_range(bias, 0, q_dim, "Q");
        l.bk = element_range(bias, q_dim, kv_dim, "K");
        l.bv = element_range(bias, q_dim + kv_dim, kv_dim, "V");
      }
    } else {
      l.wq = find.require(p + "attn_q.weight", hp.n_embd, q_dim);
      l.wk = find.require(p + "attn_k.weight", hp.n_embd, kv_dim);
      l.wv = find.require(p + "attn_v.weight", hp.n_embd, kv_dim);
      const auto bias = [&](const char* name, uint64_t n) {
        return arch.qkv_bias ? find.require(p + name, n, 1) : find.optional(p + name, n, 1);
      };
      l.bq = bias("attn_q.bias", q_dim);
      l.bk = bias("attn_k.bias", kv_dim);
      l.bv = bias("attn_v.bias", kv_dim);
      if (l.bq.present() != l.bk.present() || l.bq.present() != l.bv.present()) {
        throw Error("layer " + std::to_string(i) + " has biases for only some of Q, K and V; m40-llm needs all or none");
      }
    }
    if (arch.qk_norm) {
      l.q_norm = find.require(p + "attn_q_norm.weight", hp.head_dim(), 1);
      l.k_norm = find.require(p + "attn_k_norm.weight", hp.head_dim(), 1);
    }
    l.wo = find.require(p + "attn_output.weight", q_dim, hp.n_embd);
    l.bo = find.optional(p + "attn_output.bias", hp.n_embd, 1);
    l.ffn_norm = find.require(p + "ffn_norm.weight", hp.n_embd, 1);
    if (hp.n_expert > 0) {
      l.ffn_gate_inp = find.require(p + "ffn_gate_inp.weight", hp.n_embd, hp.n_expert);
      l.gate_exps = find.require_slices(p + "ffn_gate_exps.weight", hp.n_embd, hp.n_ff_expert, hp.n_expert);
      l.up_exps = find.require_slices(p + "ffn_up_exps.weight", hp.n_embd, hp.n_ff_expert, hp.n_expert);
      l.down_exps = find.require_slices(p + "ffn_down_exps.weight", hp.n_ff_expert, hp.n_embd, hp.n_expert);
      if (arch.shared_expert) {
        l.gate_inp_shexp = find.require(p + "ffn_gate_inp_shexp.weight", hp.n_embd, 1);
        l.gate_shexp = find.require(p + "ffn_gate_shexp.weight", hp.n_embd, hp.n_ff_shared_expert);
        l.up_shexp = find.require(p + "ffn_up_shexp.weight", hp.n_embd, hp.n_ff_shared_expert);
        l.down_shexp = find.require(p + "ffn_down_shexp.weight", hp.n_ff_shared_expert, hp.n_embd);
      }
    } else if (arch.fused_gate_up) {
      const WeightView gate_up = find.require(p + "ffn_up.weight", hp.n_embd, 2 * uint64_t{hp.n_ff});
      l.w_gate = row_range(gate_up, 0, hp.n_ff, "gate");
      l.w_up = row_range(gate_up, hp.n_ff, hp.n_ff, "up");
    } else {
      l.w_gate = find.require(p + "ffn_gate.weight", hp.n_embd, hp.n_ff);
      l.w_up = find.require(p + "ffn_up.weight", hp.n_embd, hp.n_ff);
    }
    if (hp.n_expert == 0) l.w_down = find.require(p + "ffn_down.weight", hp.n_ff, hp.n_embd);
    if (arch.post_norms) {
      l.post_attn_norm = find.require(p + "post_attention_norm.weight", hp.n_embd, 1);
      l.post_ffn_norm = find.require(p + "post_ffw_norm.weight", hp.n_embd, 1);
    }
  }
  w.unused_tensors = find.unused();
  return w;
}

const WeightView* ModelWeights::rope_factors(const ModelHparams& hparams, uint32_t n_ctx) const {
  if (rope_freqs.present()) return &rope_freqs;
  if (rope_factors_long.present()) {
    return hparams.use_long_rope_factors(n_ctx) ? &rope_factors_long : &rope_factors_short;
  }
  return nullptr;
}

namespace {
uint64_t view_bytes(const WeightView& v) { return v.present() ? v.row_bytes * v.rows : 0; }
}  // namespace


uint64_t ModelWeights::layer_bytes(size_t layer) const {
  const LayerWeights& l = layers.at(layer);
  uint64_t total = 0;
  for (const WeightView* v : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.bq, &l.bk, &l.bv, &l.q_norm, &l.k_norm, &l.wo, &l.bo,
                              &l.post_attn_norm, &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down, &l.post_ffn_norm}) {
    total += view_bytes(*v);
  }
  total += view_bytes(l.ffn_gate_inp);
  for (const WeightView* v : {&l.gate_inp_shexp, &l.gate_shexp, &l.up_shexp, &l.down_shexp}) total += view_bytes(*v);
  for (const auto* slices : {&l.gate_exps, &l.up_exps, &l.down_exps}) {
    for (const WeightView& v : *slices) total += view_bytes(v);
  }
  return total;
}

uint64_t ModelWeights::stage_bytes(size_t first, size_t end) const {
  uint64_t total = 0;
  const bool holds_input = first == 0, holds_output = end == layers.size();
  // The RoPE factors serve every layer; they are small and counted once.
  if (holds_input) total += view_bytes(token_embd) + view_bytes(rope_freqs) + view_bytes(rope_factors_short) + view_bytes(rope_factors_long);
  for (size_t l = first; l < end; ++l) total += layer_bytes(l);
  if (holds_output) total += view_bytes(output_norm) + (tied_output && holds_input ? 0 : view_bytes(output));
  return total;
}

uint64_t ModelWeights::total_bytes() const { return stage_bytes(0, layers.size()); }

WeightView stacked_slices(const std::vector<WeightView>& slices) {
  if (slices.empty()) return {};
  WeightView all = slices[0];
  for (size_t e = 1; e < slices.size(); ++e) {
    const WeightView& v = slices[e];
    if (v.type != all.type || v.cols != all.cols || v.rows != all.rows || v.row_bytes != all.row_bytes ||
        v.data != all.data + e * all.rows * all.row_bytes) {
      throw Error("the slices of '" + all.name + "' are not one tensor");
    }
  }
  all.rows *= slices.size();
  return all;
}

}  // namespace m40::model
