// The shards of a model split by rows (row_split/row_split_backend.h) run
// their step at once, each on its own thread, and meet whenever their
// branches' partial sums are added together. A ShardGroup is what they
// share for that (the CUDA backend's ShardExchange, the CPU backend's
// ShardSums); the RowSplitBackend starts and ends each step through it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "common/error.h"

namespace m40::backend {

class ShardGroup {
 public:
  virtual ~ShardGroup() = default;
  virtual int count() const = 0;
  // Before a step, with every shard idle: nothing abandoned.
  virtual void begin_step() = 0;
  // A shard's thread failed: the others' waits end with an error.
  virtual void abandon() = 0;
  // On the failed shard's thread: lets go of what it holds.
  virtual void release(int /*shard*/) {}
};

// A barrier of `count` threads that can be abandoned: every waiter then
// throws m40::Error, so no shard waits forever for one that failed.
class Rendezvous {
 public:
  explicit Rendezvous(int count) : count_(count) {}
  // Blocks until all `count` threads have arrived as often as this one.
  void arrive_and_wait() {
    std::unique_lock lock(mutex_);
    if (abandoned_) throw Error("the row split's step was abandoned by another shard");
    const uint64_t generation = generation_;
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++generation_;
      changed_.notify_all();
      return;
    }
    changed_.wait(lock, [&] { return generation_ != generation || abandoned_; });
    if (generation_ == generation) throw Error("the row split's step was abandoned by another shard");
  }
  void abandon() {
    std::lock_guard lock(mutex_);
    abandoned_ = true;
    changed_.notify_all();
  }
  // Before a step (no thread waiting).
  void reset() {
    std::lock_guard lock(mutex_);
    abandoned_ = false;
    arrived_ = 0;
  }

 private:
  const int count_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool abandoned_ = false;
};

}  // namespace m40::backend
