#include "backends/cuda/stage_timer.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backends/cuda/cuda_check.h"

namespace m40::cuda {

StageTimer::StageTimer() {
  const char* env = std::getenv("M40_CUDA_STAGE_TIMES");
  enabled_ = env != nullptr && std::strcmp(env, "1") == 0;
}

StageTimer::~StageTimer() {
  if (!enabled_) return;
  double all = 0;
  for (const auto& [name, t] : totals_) all += t.ms;
  std::vector<std::pair<std::string, Total>> rows(totals_.begin(), totals_.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  std::fprintf(stderr, "\nGPU time by stage (M40_CUDA_STAGE_TIMES=1), %.3f ms in all:\n", all);
  std::fprintf(stderr, "| stage | ms | share | runs | us per run |\n| --- | ---: | ---: | ---: | ---: |\n");
  for (const auto& [name, t] : rows) {
    std::fprintf(stderr, "| %s | %.3f | %.1f%% | %ld | %.2f |\n", name.c_str(), t.ms, all > 0 ? 100.0 * t.ms / all : 0.0,
                 t.calls, t.calls > 0 ? 1000.0 * t.ms / static_cast<double>(t.calls) : 0.0);
  }
  for (auto& m : marks_) cudaEventDestroy(m.event);
}

void StageTimer::begin(cudaStream_t stream) {
  if (!enabled_) return;
  next_ = 0;
  mark(stream, "");  // the start
}

void StageTimer::mark(cudaStream_t stream, const char* name) {
  if (!enabled_) return;
  if (next_ == marks_.size()) {
    cudaEvent_t e = nullptr;
    M40_CUDA_CHECK(cudaEventCreate(&e));
    marks_.push_back({e, name});
  }
  Mark& m = marks_[next_++];
  m.name = name;
  M40_CUDA_CHECK(cudaEventRecord(m.event, stream));
}

void StageTimer::collect() {
  if (!enabled_) return;
  for (size_t i = 1; i < next_; ++i) {  // only this step's marks
    float ms = 0;
    M40_CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[i - 1].event, marks_[i].event));
    Total& t = totals_[marks_[i].name];
    t.ms += ms;
    ++t.calls;
  }
  next_ = 0;
}

}  // namespace m40::cuda
