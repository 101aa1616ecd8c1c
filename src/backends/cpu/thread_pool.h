// A fixed set of worker threads that run one data-parallel loop at a time.
// The forward pass issues many short loops (one per matrix product), so the
// workers stay alive between them instead of being spawned each time.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace m40::cpu {

class ThreadPool {
 public:
  // threads = 0: one per hardware thread.
  explicit ThreadPool(unsigned threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  unsigned size() const { return static_cast<unsigned>(workers_.size()) + 1; }

  // Calls body(begin, end, thread_index) over disjoint chunks covering
  // [0, count); the calling thread takes part. Rethrows a worker's exception.
  void parallel_for(int64_t count, const std::function<void(int64_t, int64_t, unsigned)>& body);

 private:
  void worker_loop(unsigned index);
  void run_share(unsigned index);

  std::vector<std::thread> workers_;
  // Workers spin briefly on generation_ before sleeping on start_: a decode
  // step issues dozens of short loops, and waking a sleeping thread costs
  // more than the loop itself on small models.
  std::mutex mutex_;
  std::condition_variable start_;
  std::condition_variable done_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<unsigned> pending_{0};
  std::atomic<bool> stopping_{false};
  int64_t count_ = 0;
  const std::function<void(int64_t, int64_t, unsigned)>* body_ = nullptr;
  std::exception_ptr error_;
};

}  // namespace m40::cpu
