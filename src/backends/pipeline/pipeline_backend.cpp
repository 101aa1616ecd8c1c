#include "backends/pipeline/pipeline_backend.h"

#include <algorithm>

#include "common/error.h"

namespace m40::backend {

namespace {
std::string describe(const Backend& b) {
  const LayerRange r = b.layers();
  return b.name() + " (layers " + std::to_string(r.first) + "-" + std::to_string(r.end - 1) + ")";
}
}  // namespace

PipelineBackend::PipelineBackend(std::vector<std::unique_ptr<Backend>> stages, int n_layer) : stages_(std::move(stages)) {
  if (stages_.empty()) throw Error("a split model needs at least one stage");
  int next = 0;
  for (const auto& s : stages_) {
    if (!s) throw Error("a split model's stage is missing");
    const LayerRange r = s->layers();
    if (r.size() <= 0) throw Error("the " + s->name() + " backend cannot run as one stage of a model split over devices");
    if (r.first != next) {
      throw Error("the stages of a split model must take its layers in order: " + describe(*s) + " does not begin at layer " +
                  std::to_string(next));
    }
    next = r.end;
    const Backend& first = *stages_.front();
    if (s->n_ctx() != first.n_ctx() || s->n_seq_max() != first.n_seq_max() || s->n_vocab() != first.n_vocab() ||
        s->n_embd() != first.n_embd()) {
      throw Error("the stages " + describe(first) + " and " + describe(*s) +
                  " differ in context, sequences, vocabulary or hidden width");
    }
  }
  if (next != n_layer) {
    throw Error("the stages of a split model end at layer " + std::to_string(next - 1) + " of " + std::to_string(n_layer));
  }
  if (stages_.size() > 1 && stages_.front()->n_embd() <= 0) throw Error("the stages of a split model give no hidden states");
}

std::string PipelineBackend::name() const {
  std::string out;
  for (const auto& s : stages_) out += (out.empty() ? "" : " + ") + describe(*s);
  return out;
}

uint64_t PipelineBackend::memory_bytes() const {
  uint64_t bytes = 0;
  for (const auto& s : stages_) bytes += s->memory_bytes();
  return bytes;
}

uint64_t PipelineBackend::gpu_memory_bytes() const {
  uint64_t bytes = 0;
  for (const auto& s : stages_) bytes += s->gpu_memory_bytes();
  return bytes;
}

int PipelineBackend::n_kv_blocks() const {
  int n = stages_.front()->n_kv_blocks();
  for (const auto& s : stages_) n = std::min(n, s->n_kv_blocks());
  return n;
}

void PipelineBackend::check_blocks(std::span<const int32_t> blocks) const {
  const int n_blocks = n_kv_blocks();
  for (int32_t b : blocks) {
    if (b < 0 || b >= n_blocks) throw Error("KV block " + std::to_string(b) + " is outside the pool of " + std::to_string(n_blocks));
  }
}

void PipelineBackend::set_blocks(int seq, std::span<const int32_t> blocks, int n_cached) {
  check_blocks(blocks);
  for (auto& s : stages_) s->set_blocks(seq, blocks, n_cached);
}

void PipelineBackend::copy_block(int32_t src, int32_t dst) {
  const int32_t both[] = {src, dst};
  check_blocks(both);
  for (auto& s : stages_) s->copy_block(src, dst);
}

void PipelineBackend::forward(const Batch& batch, std::span<float> logits) {
  hidden_.resize(batch.size() * static_cast<size_t>(std::max(n_embd(), 0)));
  for (size_t i = 0; i < stages_.size(); ++i) {
    const bool last = i + 1 == stages_.size();
    stages_[i]->forward_stage(batch, hidden_, last ? logits : std::span<float>());
  }
}

}  // namespace m40::backend
