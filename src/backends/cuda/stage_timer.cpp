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
  for (auto& [key, marks] : runs_) {
    for (auto& m : marks) cudaEventDestroy(m.event);
  }
}

void StageTimer::begin(cudaStream_t stream, int key) {
  if (!enabled_) return;
  current_ = &runs_[key];
  next_ = 0;
  mark(stream, "");  // the start
}

void StageTimer::mark(cudaStream_t stream, const char* name) {
  if (!enabled_ || current_ == nullptr) return;
  if (next_ == current_->size()) {
    cudaEvent_t e = nullptr;
    M40_CUDA_CHECK(cudaEventCreate(&e));
    current_->push_back({e, name});
  }
  Mark& m = (*current_)[next_++];
  m.name = name;
  M40_CUDA_CHECK(cudaEventRecord(m.event, stream));
}

void StageTimer::collect(int key) {
  if (!enabled_) return;
  auto it = runs_.find(key);
  if (it == runs_.end()) return;
  const std::vector<Mark>& marks = it->second;
  for (size_t i = 1; i < marks.size(); ++i) {
    float ms = 0;
    M40_CUDA_CHECK(cudaEventElapsedTime(&ms, marks[i - 1].event, marks[i].event));
    Total& t = totals_[marks[i].name];
    t.ms += ms;
    ++t.calls;
  }
  current_ = nullptr;
}

}  // namespace m40::cuda
