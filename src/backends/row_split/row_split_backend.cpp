#include "backends/row_split/row_split_backend.h"

#include <atomic>
#include <exception>
#include <thread>

#include "common/error.h"

namespace m40::backend {

RowSplitBackend::RowSplitBackend(std::unique_ptr<ShardGroup> group, std::vector<std::unique_ptr<Backend>> shards)
    : group_(std::move(group)), shards_(std::move(shards)) {
  if (!group_ || shards_.empty() || group_->count() != static_cast<int>(shards_.size())) {
    throw Error("a row split needs its shards and the group they share");
  }
  const Backend& first = *shards_.front();
  for (const auto& s : shards_) {
    if (!s) throw Error("a row split's shard is missing");
    if (s->n_ctx() != first.n_ctx() || s->n_seq_max() != first.n_seq_max() || s->n_vocab() != first.n_vocab() ||
        s->n_embd() != first.n_embd() || s->n_kv_blocks() != first.n_kv_blocks()) {
      throw Error("the shards of a row split differ in context, sequences, vocabulary, hidden width or KV pool");
    }
  }
}

RowSplitBackend::~RowSplitBackend() = default;

std::string RowSplitBackend::name() const {
  std::string name;
  for (const auto& s : shards_) name += (name.empty() ? "" : " + ") + s->name();
  return name + " (row split)";
}

uint64_t RowSplitBackend::memory_bytes() const {
  uint64_t total = 0;
  for (const auto& s : shards_) total += s->memory_bytes();
  return total;
}

uint64_t RowSplitBackend::gpu_memory_bytes() const {
  uint64_t total = 0;
  for (const auto& s : shards_) total += s->gpu_memory_bytes();
  return total;
}

void RowSplitBackend::set_blocks(int seq, std::span<const int32_t> blocks, int n_cached) {
  for (auto& s : shards_) s->set_blocks(seq, blocks, n_cached);
}

void RowSplitBackend::copy_block(int32_t src, int32_t dst) {
  for (auto& s : shards_) s->copy_block(src, dst);
}

void RowSplitBackend::forward(const Batch& batch, std::span<float> logits) {
  group_->begin_step();
  // Every shard checks the batch before it computes anything (shard 0 the
  // output buffer too). The first failure is the one reported; it releases
  // the shards that wait for the failed one.
  std::vector<std::exception_ptr> errors(shards_.size());
  std::atomic<int> first_failure{-1};
  const auto run = [&](size_t i) {
    try {
      shards_[i]->forward_shard(batch, i == 0 ? logits : std::span<float>{});
    } catch (...) {
      errors[i] = std::current_exception();
      int none = -1;
      first_failure.compare_exchange_strong(none, static_cast<int>(i));
      group_->release(static_cast<int>(i));
      group_->abandon();
    }
  };
  {
    std::vector<std::jthread> others;
    for (size_t i = 1; i < shards_.size(); ++i) others.emplace_back(run, i);
    run(0);
  }  // joined
  if (const int failed = first_failure.load(); failed >= 0) std::rethrow_exception(errors[static_cast<size_t>(failed)]);
}

}  // namespace m40::backend
