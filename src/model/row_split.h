// A model's matrices divided by rows over devices (tensor parallelism,
// `--split-mode row`). Each shard holds some of the KV heads, with their
// query heads, their rows of Q, K and V and the matching columns of the
// attention's output product, and a run of the FFN's columns: those rows
// of gate and up and the matching columns of down. A branch's output
// product then gives each shard a partial sum over its heads or columns,
// and the shards add them together (an all-reduce) before the residual
// add; norms, embedding and residual stream are computed whole on every
// shard, so every shard sees the same hidden states.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/hparams.h"
#include "model/weights.h"

namespace m40::model {

struct RowShard {
  int index = 0;
  int count = 1;
  uint32_t kv_head_first = 0, kv_head_end = 0;  // the KV heads [first, end); query heads follow their KV head
  uint64_t ff_first = 0, ff_end = 0;            // the FFN columns [first, end)
  bool whole() const { return count == 1; }
};

// The shards for devices with these shares (one per device, any positive
// scale), dividing the KV heads and the FFN columns in proportion, each
// shard getting at least one unit of each. A unit of heads is the fewest
// KV heads whose columns of the output product start on a block boundary
// of its type in every layer; a unit of FFN columns is a block of the down
// product's type. Throws m40::Error naming the reason where the model
// cannot be split that way: experts, too few units for the devices, an FFN
// width that is not a whole number of blocks.
std::vector<RowShard> plan_row_split(const ModelHparams& hp, const ModelWeights& w, std::span<const double> shares);

// The hyperparameters one shard computes with: its query and KV heads and
// its FFN width; everything else as the model's.
ModelHparams shard_hparams(const ModelHparams& hp, const RowShard& shard);

// A shard's share of a matrix read by columns (the output and down
// products): per row, `bytes` at byte `offset` of the row.
struct ColumnSlice {
  uint64_t offset = 0;
  uint64_t bytes = 0;
};
// Columns [first, end) of w; throws m40::Error where they do not start and
// end on block boundaries of its type.
ColumnSlice column_slice(const WeightView& w, uint64_t first, uint64_t end);

// The rows of a layer's matrices a shard holds, and the columns of its
// output and down products.
struct ShardRows {
  uint64_t q_first, q_end;    // rows of wq (and columns of wo, entries of bq)
  uint64_t kv_first, kv_end;  // rows of wk, wv (entries of bk, bv)
  uint64_t ff_first, ff_end;  // rows of w_gate, w_up (columns of w_down)
};
ShardRows shard_rows(const ModelHparams& hp, const RowShard& shard);

// A layer as a shard with rows `r` sees it: its rows of Q, K, V, gate and
// up and its entries of the Q/K/V biases, as views of the mapping. The
// output and down products stay whole: their shares are columns
// (column_slice), which each backend copies out its own way.
LayerWeights row_slices(const LayerWeights& l, const ShardRows& r);

}  // namespace m40::model
