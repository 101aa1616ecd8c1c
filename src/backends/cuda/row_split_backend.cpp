#include "backends/cuda/row_split_backend.h"

#include <atomic>
#include <exception>
#include <thread>

#include "common/error.h"
#include "model/row_split.h"

namespace m40::cuda {

RowSplitBackend::RowSplitBackend(const model::ModelHparams& hparams, const model::ModelWeights& weights,
                                 CudaBackendOptions options, const std::vector<int>& devices,
                                 const std::vector<double>& shares) {
  if (devices.size() != shares.size()) throw Error("a row split needs one share per GPU");
  const std::vector<model::RowShard> plan = model::plan_row_split(hparams, weights, shares);
  exchange_ = std::make_unique<ShardExchange>(devices, static_cast<int64_t>(options.max_batch) * hparams.n_embd);
  for (const model::RowShard& shard : plan) {
    options.device = devices[static_cast<size_t>(shard.index)];
    options.shard = shard;
    options.exchange = exchange_.get();
    shards_.push_back(std::make_unique<CudaBackend>(hparams, weights, options));
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

void RowSplitBackend::set_blocks(int seq, std::span<const int32_t> blocks, int n_cached) {
  for (auto& s : shards_) s->set_blocks(seq, blocks, n_cached);
}

void RowSplitBackend::copy_block(int32_t src, int32_t dst) {
  for (auto& s : shards_) s->copy_block(src, dst);
}

void RowSplitBackend::forward(const backend::Batch& batch, std::span<float> logits) {
  exchange_->begin_step();
  // Every shard checks the batch before it enqueues anything (shard 0 the
  // output buffer too). The first failure is the one reported; it releases
  // the shards that wait for the failed one at an exchange.
  std::vector<std::exception_ptr> errors(shards_.size());
  std::atomic<int> first_failure{-1};
  const auto run = [&](size_t i) {
    try {
      shards_[i]->forward_shard(batch, i == 0 ? logits : std::span<float>{});
    } catch (...) {
      errors[i] = std::current_exception();
      int none = -1;
      first_failure.compare_exchange_strong(none, static_cast<int>(i));
      exchange_->release_capture(static_cast<int>(i));
      exchange_->abandon();
    }
  };
  {
    std::vector<std::jthread> others;
    for (size_t i = 1; i < shards_.size(); ++i) others.emplace_back(run, i);
    run(0);
  }  // joined
  if (const int failed = first_failure.load(); failed >= 0) std::rethrow_exception(errors[static_cast<size_t>(failed)]);
}

}  // namespace m40::cuda
