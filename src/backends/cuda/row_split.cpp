#include "backends/cuda/row_split.h"

#include "backends/cuda/shard_exchange.h"
#include "common/error.h"
#include "model/row_split.h"

namespace m40::cuda {

std::unique_ptr<backend::RowSplitBackend> make_row_split_backend(const model::ModelHparams& hparams,
                                                                 const model::ModelWeights& weights,
                                                                 CudaBackendOptions options,
                                                                 const std::vector<int>& devices,
                                                                 const std::vector<double>& shares) {
  if (devices.size() != shares.size()) throw Error("a row split needs one share per GPU");
  const std::vector<model::RowShard> plan = model::plan_row_split(hparams, weights, shares);
  auto exchange = std::make_unique<ShardExchange>(devices, static_cast<int64_t>(options.max_batch) * hparams.n_embd);
  std::vector<std::unique_ptr<backend::Backend>> shards;
  for (const model::RowShard& shard : plan) {
    options.device = devices[static_cast<size_t>(shard.index)];
    options.shard = shard;
    options.exchange = exchange.get();
    shards.push_back(std::make_unique<CudaBackend>(hparams, weights, options));
  }
  return std::make_unique<backend::RowSplitBackend>(std::move(exchange), std::move(shards));
}

}  // namespace m40::cuda
