// A model split by rows over GPUs (row_split/row_split_backend.h): one
// CudaBackend shard per GPU, their branches added through a ShardExchange.
#pragma once

#include <memory>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/row_split/row_split_backend.h"

namespace m40::cuda {

// One shard per GPU of `devices` (a GPU may repeat: its shards then share
// it), the layers divided by `shares` (one per GPU, model::plan_row_split);
// `options` as for one CudaBackend (its device, shard and exchange are set
// here). Throws m40::Error where the model cannot be split so or a shard
// does not fit its GPU.
std::unique_ptr<backend::RowSplitBackend> make_row_split_backend(const model::ModelHparams& hparams,
                                                                 const model::ModelWeights& weights,
                                                                 CudaBackendOptions options,
                                                                 const std::vector<int>& devices,
                                                                 const std::vector<double>& shares);

}  // namespace m40::cuda
