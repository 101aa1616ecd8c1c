#include "backends/cpu/row_split.h"

#include "model/row_split.h"

namespace m40::cpu {

std::unique_ptr<backend::RowSplitBackend> make_row_split_backend(const model::ModelHparams& hparams,
                                                                 const model::ModelWeights& weights,
                                                                 CpuBackendOptions options,
                                                                 const std::vector<double>& shares) {
  const std::vector<model::RowShard> plan = model::plan_row_split(hparams, weights, shares);
  auto sums = std::make_unique<ShardSums>(static_cast<int>(plan.size()));
  std::vector<std::unique_ptr<backend::Backend>> shards;
  for (const model::RowShard& shard : plan) {
    options.shard = shard;
    options.sums = sums.get();
    shards.push_back(std::make_unique<CpuBackend>(hparams, weights, options));
  }
  return std::make_unique<backend::RowSplitBackend>(std::move(sums), std::move(shards));
}

}  // namespace m40::cpu
