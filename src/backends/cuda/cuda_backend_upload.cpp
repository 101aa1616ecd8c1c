// CudaBackend's weight upload: the model's matrices and vectors copied from
// the file mapping into the weights arena through pinned staging buffers,
// a stage's or shard's share of them, the matrices fused for one decode
// product laid out back to back.
#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "common/error.h"
#include "quant/dequantize.h"

namespace m40::cuda {

namespace {

// Uploads go through two pinned buffers of this size, alternately, so the
// copy of one overlaps the memcpy from the mapping into the other.
constexpr size_t kStagingBytes = 64ull << 20;

}  // namespace

// Copies weights from the mapping to the device through two pinned buffers
// used alternately, so filling one overlaps the DMA of the other.
class CudaBackend::Uploader {
 public:
  explicit Uploader(cudaStream_t stream) : stream_(stream) {
    for (int i = 0; i < 2; ++i) {
      staging_[i] = PinnedBuffer(kStagingBytes);
      M40_CUDA_CHECK(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming));
    }
  }
  ~Uploader() {
    cudaStreamSynchronize(stream_);
    for (auto e : done_) cudaEventDestroy(e);
  }
  void copy(void* dst, const uint8_t* src, size_t bytes) { copy_rows(dst, src, 1, bytes, bytes); }
  // `rows` runs of `bytes` each, `stride` bytes apart in src, packed back
  // to back at dst (a slice of every row's columns).
  void copy_rows(void* dst, const uint8_t* src, size_t rows, size_t stride, size_t bytes) {
    const size_t total = rows * bytes;
    for (size_t offset = 0; offset < total; offset += kStagingBytes) {
      const size_t n = std::min(kStagingBytes, total - offset);
      M40_CUDA_CHECK(cudaEventSynchronize(done_[next_]));  // this buffer's previous copy has finished
      uint8_t* staging = staging_[next_].as<uint8_t>();
      for (size_t done = 0; done < n;) {  // the pieces of rows this chunk covers
        const size_t at = offset + done, row = at / bytes, in_row = at % bytes;
        const size_t piece = std::min(bytes - in_row, n - done);
        std::memcpy(staging + done, src + row * stride + in_row, piece);
        done += piece;
      }
      M40_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(dst) + offset, staging, n, cudaMemcpyHostToDevice, stream_));
      M40_CUDA_CHECK(cudaEventRecord(done_[next_], stream_));
      next_ ^= 1;
    }
  }

 private:
  cudaStream_t stream_;
  PinnedBuffer staging_[2];
  cudaEvent_t done_[2] = {nullptr, nullptr};
  int next_ = 0;
};

DeviceWeight CudaBackend::upload_matrix(const model::WeightView& w, Uploader& uploader) {
  const size_t bytes = w.row_bytes * w.rows;
  void* dst = weights_arena_.take(bytes);
  uploader.copy(dst, w.data, bytes);
  DeviceWeight d;
  d.type = w.type;
  d.cols = static_cast<int64_t>(w.cols);
  d.rows = static_cast<int64_t>(w.rows);
  d.row_bytes = w.row_bytes;
  d.data = dst;
  return d;
}

DeviceWeight CudaBackend::upload_columns(const model::WeightView& w, uint64_t first, uint64_t end, Uploader& uploader) {
  const model::ColumnSlice slice = model::column_slice(w, first, end);
  void* dst = weights_arena_.take(slice.bytes * w.rows);
  uploader.copy_rows(dst, w.data + slice.offset, w.rows, w.row_bytes, slice.bytes);
  DeviceWeight d;
  d.type = w.type;
  d.cols = static_cast<int64_t>(end - first);
  d.rows = static_cast<int64_t>(w.rows);
  d.row_bytes = slice.bytes;
  d.data = dst;
  return d;
}

DeviceWeight CudaBackend::upload_interleaved(const std::vector<model::WeightView>& gate,
                                             const std::vector<model::WeightView>& up, Uploader& uploader) {
  const model::WeightView& g = gate.front();
  const size_t gate_bytes = g.row_bytes * g.rows, up_bytes = up.front().row_bytes * up.front().rows;
  auto* dst = static_cast<uint8_t*>(weights_arena_.take((gate_bytes + up_bytes) * gate.size()));
  for (size_t e = 0; e < gate.size(); ++e) {
    uploader.copy(dst + e * (gate_bytes + up_bytes), gate[e].data, gate_bytes);
    uploader.copy(dst + e * (gate_bytes + up_bytes) + gate_bytes, up[e].data, up_bytes);
  }
  DeviceWeight d;
  d.type = g.type;
  d.cols = static_cast<int64_t>(g.cols);
  d.rows = static_cast<int64_t>((g.rows + up.front().rows) * gate.size());
  d.row_bytes = g.row_bytes;
  d.data = dst;
  return d;
}

const float* CudaBackend::upload_vector(const model::WeightView& w) {
  if (!w.present()) return nullptr;
  std::vector<float> values(w.cols * w.rows);
  quant::dequantize_row(w.type, w.data, values.data(), static_cast<int64_t>(values.size()));
  auto* dst = static_cast<float*>(weights_arena_.take(values.size() * sizeof(float)));
  M40_CUDA_CHECK(cudaMemcpy(dst, values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice));
  return dst;
}

namespace {

// Matrices uploaded one after the other, of one type and width, as one
// matrix with their rows (for a fused decode product); rows 0 when they are
// not back to back.
DeviceWeight back_to_back(std::initializer_list<const DeviceWeight*> matrices) {
  const DeviceWeight& first = **matrices.begin();
  DeviceWeight fused = first;
  const uint8_t* next = static_cast<const uint8_t*>(first.data) + first.rows * first.row_bytes;
  for (auto it = matrices.begin() + 1; it != matrices.end(); ++it) {
    const DeviceWeight& m = **it;
    if (m.type != first.type || m.cols != first.cols || m.row_bytes != first.row_bytes || m.data != next) return {};
    fused.rows += m.rows;
    next += m.rows * m.row_bytes;
  }
  return fused;
}

}  // namespace

void CudaBackend::upload_weights(const model::ModelWeights& weights) {
  weights_arena_ = Arena(plan_.weights);
  Uploader up(copy_stream_);
  // A stage holds the token embedding where it begins at layer 0 (or its
  // tied head reads it), the output norm and head where it ends at the last.
  if (holds_input() || (computes_output() && weights.tied_output)) token_embd_ = upload_matrix(weights.token_embd, up);
  if (computes_output()) {
    output_ = weights.tied_output ? token_embd_ : upload_matrix(weights.output, up);
    output_norm_ = upload_vector(weights.output_norm);
  }
  if (const model::WeightView* factors = weights.rope_factors(hparams_, static_cast<uint32_t>(options_.n_ctx))) {
    rope_factors_ = upload_vector(*factors);
  }
  for (int li = stage_.first; li < stage_.end; ++li) {
    // A row split's shard takes its rows of Q, K, V, gate and up, its
    // entries of the Q/K/V biases (model::row_slices) and its columns of the
    // output and down products.
    const model::LayerWeights& whole = weights.layers[static_cast<size_t>(li)];
    model::LayerWeights sliced;
    if (sharded()) sliced = model::row_slices(whole, shard_rows_);
    const model::LayerWeights& l = sharded() ? sliced : whole;
    const auto columns = [&](const model::WeightView& w, uint64_t first, uint64_t end) {
      return sharded() && w.present() ? upload_columns(w, first, end, up) : upload_matrix(w, up);
    };
    LayerOnDevice d{};
    d.attn_norm = upload_vector(l.attn_norm);
    d.wq = upload_matrix(l.wq, up);
    d.wk = upload_matrix(l.wk, up);
    d.wv = upload_matrix(l.wv, up);
    d.wo = columns(l.wo, shard_rows_.q_first, shard_rows_.q_end);
    d.ffn_norm = upload_vector(l.ffn_norm);
    d.w_gate = upload_matrix(l.w_gate, up);
    d.w_up = upload_matrix(l.w_up, up);
    d.w_down = columns(l.w_down, shard_rows_.ff_first, shard_rows_.ff_end);
    // The vectors after the matrices, which must stay back to back.
    d.bq = upload_vector(l.bq);
    d.bk = upload_vector(l.bk);
    d.bv = upload_vector(l.bv);
    d.bo = upload_vector(l.bo);
    d.q_norm = upload_vector(l.q_norm);
    d.k_norm = upload_vector(l.k_norm);
    d.post_attn_norm = upload_vector(l.post_attn_norm);
    d.post_ffn_norm = upload_vector(l.post_ffn_norm);
    d.wqkv = back_to_back({&d.wq, &d.wk, &d.wv});
    d.qkv_parts = 3;
    if (d.wqkv.rows == 0) {
      d.wqkv = back_to_back({&d.wq, &d.wk});
      d.qkv_parts = 2;
    }
    d.w_gate_up = back_to_back({&d.w_gate, &d.w_up});
    if (l.has_experts()) {
      const model::WeightView& gate = l.gate_exps.front();
      const model::WeightView& upv = l.up_exps.front();
      if (gate.type == upv.type && gate.row_bytes == upv.row_bytes) {
        d.gate_up_exps = upload_interleaved(l.gate_exps, l.up_exps, up);
      } else {
        d.gate_exps = upload_matrix(model::stacked_slices(l.gate_exps), up);
        d.up_exps = upload_matrix(model::stacked_slices(l.up_exps), up);
      }
      d.down_exps = upload_matrix(model::stacked_slices(l.down_exps), up);
      d.router = upload_matrix(l.ffn_gate_inp, up);
      if (l.has_shared_expert()) {
        // The gate's row right after the router's rows: one product for both.
        d.shexp_gate_inp = upload_matrix(l.gate_inp_shexp, up);
        d.router_and_shexp_gate = back_to_back({&d.router, &d.shexp_gate_inp});
        d.shexp_gate = upload_matrix(l.gate_shexp, up);
        d.shexp_up = upload_matrix(l.up_shexp, up);
        d.shexp_down = upload_matrix(l.down_shexp, up);
        d.shexp_gate_up = back_to_back({&d.shexp_gate, &d.shexp_up});
      }
    }
    layers_.push_back(d);
  }
  M40_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
  // The norm vectors went up with plain cudaMemcpy from pageable memory,
  // which may return before the transfer lands, on the default stream,
  // which the non-blocking compute stream does not wait for.
  M40_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace m40::cuda
