// Splits [0, count) into contiguous chunks over worker threads. For coarse
// work such as filling tensors row by row; the engine has its own pool.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace m40 {

inline unsigned default_thread_count() { return std::max(1u, std::thread::hardware_concurrency()); }

// Calls body(begin, end) on disjoint ranges covering [0, count). The first
// exception thrown by any worker is rethrown on the calling thread.
inline void parallel_for(int64_t count, unsigned threads,
                         const std::function<void(int64_t begin, int64_t end)>& body) {
  threads = static_cast<unsigned>(std::clamp<int64_t>(threads, 1, std::max<int64_t>(count, 1)));
  if (threads == 1) {
    if (count > 0) body(0, count);
    return;
  }
  std::exception_ptr error;
  std::mutex error_mutex;
  std::vector<std::thread> workers;
  const int64_t chunk = (count + threads - 1) / threads;
  for (unsigned t = 0; t < threads; ++t) {
    const int64_t begin = t * chunk;
    const int64_t end = std::min(count, begin + chunk);
    if (begin >= end) break;
    workers.emplace_back([&, begin, end] {
      try {
        body(begin, end);
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    });
  }
  for (auto& w : workers) w.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace m40
