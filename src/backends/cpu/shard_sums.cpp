#include "backends/cpu/shard_sums.h"

#include <algorithm>

namespace m40::cpu {

void ShardSums::all_reduce(int shard, float* data, int64_t n) {
  parts_[static_cast<size_t>(shard)] = data;
  rendezvous_.arrive_and_wait();  // every partial published
  std::vector<float> sum(parts_[0], parts_[0] + n);
  for (size_t j = 1; j < parts_.size(); ++j) {
    const float* part = parts_[j];
    for (int64_t i = 0; i < n; ++i) sum[static_cast<size_t>(i)] += part[i];
  }
  rendezvous_.arrive_and_wait();  // every shard has read every partial
  std::copy(sum.begin(), sum.end(), data);
}

}  // namespace m40::cpu
