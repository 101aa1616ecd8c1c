#include "model/llama_weights.h"

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
    return v;
  }

  const gguf::File& file_;
};

}  // namespace

LlamaWeights LlamaWeights::load(const gguf::File& file, const LlamaHparams& hp) {
  if (!hp.traits->runnable) {
    throw Error("unsupported architecture " + hp.architecture + ": m40-llm cannot run it yet");
  }
  WeightFinder find(file);
  LlamaWeights w;
  w.token_embd = find.require("token_embd.weight", hp.n_embd, hp.n_vocab);
  w.output_norm = find.require("output_norm.weight", hp.n_embd, 1);
  w.output = find.optional("output.weight", hp.n_embd, hp.n_vocab);
  if (!w.output.present()) {
    w.output = w.token_embd;
    w.tied_output = true;
  }
  w.rope_freqs = find.optional("rope_freqs.weight", hp.n_rot / 2, 1);
  // Every layer has at least 9 tensors (norms, Q, K, V, output, gate, up,
  // down). Checked before the layers are allocated, so a crafted block_count
  // cannot make a small file allocate gigabytes.
  constexpr uint64_t kTensorsPerLayer = 9;
  if (hp.n_layer > file.tensors().size() / kTensorsPerLayer) {
    throw Error(arch_key(hp.architecture, "block_count") + " is " + std::to_string(hp.n_layer) +
                ", but the file holds only " + std::to_string(file.tensors().size()) + " tensors, fewer than the " +
                std::to_string(kTensorsPerLayer) + " each layer needs (corrupt metadata or a truncated model)");
  }
  w.layers.resize(hp.n_layer);
  for (uint32_t i = 0; i < hp.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[i];
    l.attn_norm = find.require(p + "attn_norm.weight", hp.n_embd, 1);
    l.wq = find.require(p + "attn_q.weight", hp.n_embd, hp.q_dim());
    l.wk = find.require(p + "attn_k.weight", hp.n_embd, hp.kv_dim());
    l.wv = find.require(p + "attn_v.weight", hp.n_embd, hp.kv_dim());
    if (hp.traits->attention_qkv_bias) {
      l.bq = find.require(p + "attn_q.bias", hp.q_dim(), 1);
      l.bk = find.require(p + "attn_k.bias", hp.kv_dim(), 1);
      l.bv = find.require(p + "attn_v.bias", hp.kv_dim(), 1);
    }
    l.wo = find.require(p + "attn_output.weight", hp.q_dim(), hp.n_embd);
    l.ffn_norm = find.require(p + "ffn_norm.weight", hp.n_embd, 1);
    l.w_gate = find.require(p + "ffn_gate.weight", hp.n_embd, hp.n_ff);
    l.w_up = find.require(p + "ffn_up.weight", hp.n_embd, hp.n_ff);
    l.w_down = find.require(p + "ffn_down.weight", hp.n_ff, hp.n_embd);
  }
  return w;
}

uint64_t LlamaWeights::total_bytes() const {
  auto bytes = [](const WeightView& v) { return v.present() ? v.row_bytes * v.rows : 0; };
  uint64_t total = bytes(token_embd) + bytes(output_norm) + (tied_output ? 0 : bytes(output)) + bytes(rope_freqs);
  for (const auto& l : layers) {
    for (const WeightView* v : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.bq, &l.bk, &l.bv, &l.wo, &l.ffn_norm,
                                &l.w_gate, &l.w_up, &l.w_down}) {
      total += bytes(*v);
    }
  }
  return total;
}

}  // namespace m40::model
