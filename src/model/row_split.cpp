#include "model/row_split.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"
#include "gguf/tensor_type.h"

namespace m40::model {

namespace {

uint64_t block_size(const WeightView& w) { return gguf::tensor_type_traits(w.type).block_size; }

// The fewest units that keep `values_per_unit * units` a multiple of every
// block size in `blocks`.
uint64_t units_for_blocks(uint64_t values_per_unit, const std::vector<uint64_t>& blocks) {
  uint64_t units = 1;
  for (const uint64_t b : blocks) {
    const uint64_t needed = b / std::gcd(b, values_per_unit);  // units so that values_per_unit * units % b == 0
    units = std::lcm(units, needed);
  }
  return units;
}

// `total` units divided in proportion to the shares, at least one each:
// the boundaries are the rounded running sums of the shares.
std::vector<uint64_t> divide(uint64_t total, std::span<const double> shares) {
  double sum = 0;
  for (const double s : shares) sum += s;
  std::vector<uint64_t> ends;
  double running = 0;
  uint64_t previous = 0;
  for (size_t i = 0; i < shares.size(); ++i) {
    running += shares[i];
    const uint64_t left = shares.size() - 1 - i;  // shards after this one, one unit each
    uint64_t end = i + 1 == shares.size() ? total : static_cast<uint64_t>(std::llround(static_cast<double>(total) * running / sum));
    end = std::clamp<uint64_t>(end, previous + 1, total - left);
    ends.push_back(end);
    previous = end;
  }
  return ends;
}

}  // namespace

std::vector<RowShard> plan_row_split(const ModelHparams& hp, const ModelWeights& w, std::span<const double> shares) {
  const int count = static_cast<int>(shares.size());
  if (count < 1) throw Error("a row split needs at least one device");
  for (const double s : shares) {
    if (!(s > 0) || !std::isfinite(s)) throw Error("a row split's shares must be positive numbers");
  }
  if (hp.has_experts()) {
    throw Error("a row split divides dense layers only: " + hp.architecture +
                " has experts; use --split-mode layer");
  }
  // Each KV head brings n_gqa query heads, n_gqa * head_dim columns of the
  // output product; each FFN column one column of down.
  std::vector<uint64_t> wo_blocks, down_blocks;
  for (const LayerWeights& l : w.layers) {
    wo_blocks.push_back(block_size(l.wo));
    down_blocks.push_back(block_size(l.w_down));
  }
  const uint64_t head_unit = units_for_blocks(uint64_t{hp.n_gqa()} * hp.head_dim(), wo_blocks);
  const uint64_t ff_unit = units_for_blocks(1, down_blocks);
  const uint64_t head_units = hp.n_head_kv / head_unit;
  if (hp.n_head_kv % head_unit != 0 || head_units < static_cast<uint64_t>(count)) {
    throw Error("a row split gives each device whole KV heads, in groups whose output-product columns start on a "
                "block of its type: " + hp.architecture + " has " + std::to_string(hp.n_head_kv) + " KV heads in " +
                std::to_string(head_units) + " groups of " + std::to_string(head_unit) + ", for " +
                std::to_string(count) + " devices; use --split-mode layer");
  }
  if (hp.n_ff % ff_unit != 0 || hp.n_ff / ff_unit < static_cast<uint64_t>(count)) {
    throw Error("a row split divides the FFN in blocks of its down product's type: " + hp.architecture + "'s " +
                std::to_string(hp.n_ff) + " columns are not " + std::to_string(count) + " or more blocks of " +
                std::to_string(ff_unit) + "; use --split-mode layer");
  }
  const std::vector<uint64_t> head_ends = divide(head_units, shares);
  const std::vector<uint64_t> ff_ends = divide(hp.n_ff / ff_unit, shares);
  std::vector<RowShard> shards;
  for (int i = 0; i < count; ++i) {
    RowShard s;
    s.index = i;
    s.count = count;
    s.kv_head_first = static_cast<uint32_t>((i == 0 ? 0 : head_ends[i - 1]) * head_unit);
    s.kv_head_end = static_cast<uint32_t>(head_ends[i] * head_unit);
    s.ff_first = (i == 0 ? 0 : ff_ends[i - 1]) * ff_unit;
    s.ff_end = ff_ends[i] * ff_unit;
    shards.push_back(s);
  }
  return shards;
}

ModelHparams shard_hparams(const ModelHparams& hp, const RowShard& shard) {
  if (shard.whole()) return hp;
  ModelHparams s = hp;
  s.n_head_kv = shard.kv_head_end - shard.kv_head_first;
  s.n_head = s.n_head_kv * hp.n_gqa();
  s.n_ff = static_cast<uint32_t>(shard.ff_end - shard.ff_first);
  return s;
}

ShardRows shard_rows(const ModelHparams& hp, const RowShard& shard) {
  if (shard.whole()) return {0, hp.q_dim(), 0, hp.kv_dim(), 0, hp.n_ff};
  const uint64_t q_per_kv_head = uint64_t{hp.n_gqa()} * hp.head_dim();
  return {shard.kv_head_first * q_per_kv_head, shard.kv_head_end * q_per_kv_head,
          uint64_t{shard.kv_head_first} * hp.head_dim(), uint64_t{shard.kv_head_end} * hp.head_dim(),
          shard.ff_first, shard.ff_end};
}

LayerWeights row_slices(const LayerWeights& l, const ShardRows& r) {
  const auto rows = [](const WeightView& w, uint64_t first, uint64_t end) {
    return w.present() ? row_range(w, first, end - first, "shard") : w;
  };
  const auto entries = [](const WeightView& w, uint64_t first, uint64_t end) {
    return w.present() ? element_range(w, first, end - first, "shard") : w;
  };
  LayerWeights s = l;
  s.wq = rows(l.wq, r.q_first, r.q_end);
  s.wk = rows(l.wk, r.kv_first, r.kv_end);
  s.wv = rows(l.wv, r.kv_first, r.kv_end);
  s.bq = entries(l.bq, r.q_first, r.q_end);
  s.bk = entries(l.bk, r.kv_first, r.kv_end);
  s.bv = entries(l.bv, r.kv_first, r.kv_end);
  s.w_gate = rows(l.w_gate, r.ff_first, r.ff_end);
  s.w_up = rows(l.w_up, r.ff_first, r.ff_end);
  return s;
}

ColumnSlice column_slice(const WeightView& w, uint64_t first, uint64_t end) {
  const auto& traits = gguf::tensor_type_traits(w.type);
  if (first % traits.block_size != 0 || (end % traits.block_size != 0 && end != w.cols) || first >= end || end > w.cols) {
    throw Error("columns " + std::to_string(first) + " to " + std::to_string(end) + " of tensor '" + w.name +
                "' do not start and end on its " + std::string(traits.name) + " blocks of " +
                std::to_string(traits.block_size));
  }
  return {first / traits.block_size * traits.bytes_per_block,
          (end - first + traits.block_size - 1) / traits.block_size * traits.bytes_per_block};
}

}  // namespace m40::model
