#include "backends/cpu/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define M40_CPU_RELAX() _mm_pause()
#else
#define M40_CPU_RELAX() ((void)0)
#endif

namespace m40::cpu {

namespace {
// About 50-100 microseconds of polling before a thread goes to sleep.
constexpr int kSpinIterations = 20000;
}  // namespace

ThreadPool::ThreadPool(unsigned threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_.store(true);
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
    for (int i = 0; i < kSpinIterations && generation_.load(std::memory_order_acquire) == seen && !stopping_.load();
         ++i) {
      M40_CPU_RELAX();
    }
    if (generation_.load(std::memory_order_acquire) == seen && !stopping_.load()) {
      std::unique_lock lock(mutex_);
      start_.wait(lock, [&] { return stopping_.load() || generation_.load() != seen; });
    }
    if (stopping_.load()) return;
    seen = generation_.load(std::memory_order_acquire);
    run_share(index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard lock(mutex_);
      done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t count, const std::function<void(int64_t, int64_t, unsigned)>& body) {
  if (count <= 0) return;
  if (workers_.empty() || count == 1) {
    body(0, count, 0);
    return;
  }
  count_ = count;
  body_ = &body;
  error_ = nullptr;
  pending_.store(static_cast<unsigned>(workers_.size()), std::memory_order_relaxed);
  {
    std::lock_guard lock(mutex_);
    generation_.fetch_add(1, std::memory_order_release);  // publishes count_, body_ and pending_
  }
  start_.notify_all();
  run_share(0);
  for (int i = 0; i < kSpinIterations && pending_.load(std::memory_order_acquire) != 0; ++i) M40_CPU_RELAX();
  if (pending_.load(std::memory_order_acquire) != 0) {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
  }
  body_ = nullptr;
  std::exception_ptr error;
  {
    std::lock_guard lock(mutex_);
    error = error_;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace m40::cpu
