// The CPU shards' group of a model split by rows (backends/shard_group.h):
// after each branch every shard publishes its partial sum, and each adds
// all of them in shard order into its own, so every shard gets the same
// sum, bit for bit, as the CUDA shards do (cuda/shard_exchange.h).
#pragma once

#include <cstdint>
#include <vector>

#include "backends/shard_group.h"

namespace m40::cpu {

class ShardSums : public backend::ShardGroup {
 public:
  explicit ShardSums(int count) : parts_(static_cast<size_t>(count)), rendezvous_(count) {}
  int count() const override { return static_cast<int>(parts_.size()); }
  void begin_step() override { rendezvous_.reset(); }
  void abandon() override { rendezvous_.abandon(); }
  // Called by every shard's thread with its partial (n values): replaces it
  // by the sum of all shards' partials.
  void all_reduce(int shard, float* data, int64_t n);

 private:
  std::vector<float*> parts_;
  backend::Rendezvous rendezvous_;
};

}  // namespace m40::cpu
