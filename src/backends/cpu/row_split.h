// A model split by rows into CPU shards (row_split/row_split_backend.h):
// the reference of the CUDA row split (cuda/row_split.h), with the same
// slices and the same order of sums, testable without GPUs.
#pragma once

#include <memory>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/row_split/row_split_backend.h"

namespace m40::cpu {

// One shard per share (model::plan_row_split); `options` as for one
// CpuBackend (its shard and group are set here). Throws m40::Error where
// the model cannot be split so.
std::unique_ptr<backend::RowSplitBackend> make_row_split_backend(const model::ModelHparams& hparams,
                                                                 const model::ModelWeights& weights,
                                                                 CpuBackendOptions options,
                                                                 const std::vector<double>& shares);

}  // namespace m40::cpu
