// Sampling on the GPU or logits copied back: what the copy-back path costs
// per decode step, to set beside the step's time (`m40-llm bench`, tgN).
//
// For vocabularies of 32000 (Llama 2) and 128256 (Llama 3) and 1, 8 and 32
// rows (sequences in the step), times what the CUDA backend does after the
// output head: the device-to-host copy of the logits into pinned memory
// (CUDA events), the copy into the caller's buffer, and the engine's Sampler
// on every row (host clock), both greedy and with the default controls
// (repeat penalty, top-k 40, top-p 0.95, min-p 0.05, temperature 0.8).
// Medians over many repetitions after a warm-up; logits are random normal
// values, as a trained model's last layer gives roughly.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_memory.h"
#include "engine/sampler.h"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median microseconds of body() over `reps` runs after 3 untimed ones.
template <class Body>
double host_us(int reps, Body&& body) {
  for (int i = 0; i < 3; ++i) body();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    body();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  return median(t);
}

}  // namespace

int main() {
  try {
    int device = 0;
    M40_CUDA_CHECK(cudaGetDevice(&device));
    cudaDeviceProp prop{};
    M40_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    std::printf("device: %s (sm_%d%d)\n\n", prop.name, prop.major, prop.minor);
    cudaStream_t stream;
    M40_CUDA_CHECK(cudaStreamCreate(&stream));
    cudaEvent_t start, stop;
    M40_CUDA_CHECK(cudaEventCreate(&start));
    M40_CUDA_CHECK(cudaEventCreate(&stop));

    std::printf("| vocab | rows | copy to pinned, us | copy to caller, us | greedy sampling, us | default sampling, us "
                "| total per step, us |\n");
    std::printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (const int vocab : {32000, 128256}) {
      for (const int rows : {1, 8, 32}) {
        const size_t floats = static_cast<size_t>(vocab) * rows;
        float* device_logits = nullptr;
        M40_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&device_logits), floats * sizeof(float)));
        std::vector<float> host(floats);
        for (auto& v : host) v = normal(rng);
        M40_CUDA_CHECK(cudaMemcpy(device_logits, host.data(), floats * sizeof(float), cudaMemcpyHostToDevice));
        m40::cuda::PinnedBuffer pinned(floats * sizeof(float));
        std::vector<float> caller(floats);

        std::vector<double> copy_times;
        for (int i = 0; i < 53; ++i) {
          M40_CUDA_CHECK(cudaEventRecord(start, stream));
          M40_CUDA_CHECK(cudaMemcpyAsync(pinned.as<float>(), device_logits, floats * sizeof(float),
                                         cudaMemcpyDeviceToHost, stream));
          M40_CUDA_CHECK(cudaEventRecord(stop, stream));
          M40_CUDA_CHECK(cudaEventSynchronize(stop));
          float ms = 0;
          M40_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
          if (i >= 3) copy_times.push_back(ms * 1e3);
        }
        const double copy_us = median(copy_times);
        const double caller_us =
            host_us(50, [&] { std::memcpy(caller.data(), pinned.as<float>(), floats * sizeof(float)); });

        auto sampling_us = [&](const m40::engine::SamplerParams& params) {
          std::vector<m40::engine::Sampler> samplers;
          for (int r = 0; r < rows; ++r) {
            m40::engine::SamplerParams p = params;
            p.seed = 7 + r;
            samplers.emplace_back(p, vocab);
          }
          return host_us(30, [&] {
            for (int r = 0; r < rows; ++r) {
              const std::span<const float> row(caller.data() + static_cast<size_t>(r) * vocab, vocab);
              samplers[r].accept(samplers[r].sample(row));
            }
          });
        };
        m40::engine::SamplerParams greedy;
        greedy.temperature = 0.0f;
        greedy.repeat_penalty = 1.0f;
        const double greedy_us = sampling_us(greedy);
        const double default_us = sampling_us(m40::engine::SamplerParams{});
        std::printf("| %d | %d | %.1f | %.1f | %.1f | %.1f | %.1f |\n", vocab, rows, copy_us, caller_us, greedy_us,
                    default_us, copy_us + caller_us + default_us);
        cudaFree(device_logits);
      }
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaStreamDestroy(stream);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_sampling: %s\n", e.what());
    return 1;
  }
  return 0;
}
