#include "backends/cpu/thread_pool.h"

#include <algorithm>

namespace m40::cpu {

ThreadPool::ThreadPool(unsigned threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  start_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::run_share(unsigned index) {
  const int64_t n = size();
  const int64_t chunk = (count_ + n - 1) / n;
  const int64_t begin = std::min<int64_t>(count_, index * chunk);
  const int64_t end = std::min<int64_t>(count_, begin + chunk);
  if (begin >= end) return;
  try {
    (*body_)(begin, end, index);
  } catch (...) {
    std::lock_guard lock(mutex_);
    if (!error_) error_ = std::current_exception();
  }
}

void ThreadPool::worker_loop(unsigned index) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      start_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
    }
    run_share(index);
    {
      std::lock_guard lock(mutex_);
      if (--pending_ == 0) done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t count, const std::function<void(int64_t, int64_t, unsigned)>& body) {
  if (count <= 0) return;
  if (workers_.empty() || count == 1) {
    body(0, count, 0);
    return;
  }
  {
    std::lock_guard lock(mutex_);
    count_ = count;
    body_ = &body;
    error_ = nullptr;
    pending_ = static_cast<unsigned>(workers_.size());
    ++generation_;
  }
  start_.notify_all();
  run_share(0);
  std::exception_ptr error;
  {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    error = error_;
    body_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace m40::cpu
