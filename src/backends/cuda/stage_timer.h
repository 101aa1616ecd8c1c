// GPU time per stage of the forward pass (norms, products, RoPE, attention,
// ...), for finding where a model's decode time goes when no profiler is at
// hand. Off unless M40_CUDA_STAGE_TIMES=1; then the backend runs every step
// without its decode graphs, marks the end of every stage with a CUDA event,
// and prints the totals to stderr when it is destroyed. The steps are
// enqueued far ahead of the GPU, so launch gaps stay small, but a stage of
// tiny kernels reads a little longer than inside a graph.
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <string>
#include <vector>

namespace m40::cuda {

class StageTimer {
 public:
  StageTimer();  // reads M40_CUDA_STAGE_TIMES
  ~StageTimer();
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;

  bool enabled() const { return enabled_; }

  // Starts a step: the marks that follow are recorded again in order.
  void begin(cudaStream_t stream);
  // The stage that ends here is `name` (a string literal).
  void mark(cudaStream_t stream, const char* name);
  // After the stream has finished the step: adds the time between
  // consecutive marks to each stage's total.
  void collect();

 private:
  struct Mark {
    cudaEvent_t event;
    const char* name;
  };
  struct Total {
    double ms = 0;
    long calls = 0;
  };
  bool enabled_ = false;
  std::vector<Mark> marks_;  // the first one the step's start
  size_t next_ = 0;          // marks recorded in this step
  std::map<std::string, Total> totals_;
};

}  // namespace m40::cuda
