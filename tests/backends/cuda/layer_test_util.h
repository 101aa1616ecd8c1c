// Helpers for the GPU-vs-CPU tests of the layer kernels: host <-> device
// copies, NaN-poisoned outputs, random inputs and a tolerance check that
// reports the worst element.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "device_buffer.h"

namespace m40::test {

template <class T>
void to_device(DeviceBuffer<T>& d, const std::vector<T>& h) {
  ASSERT_LE(h.size() * sizeof(T), d.bytes());
  M40_CUDA_CHECK(cudaMemcpy(d.get(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
}

template <class T>
std::vector<T> from_device(const DeviceBuffer<T>& d) {
  std::vector<T> h(d.bytes() / sizeof(T));
  M40_CUDA_CHECK(cudaDeviceSynchronize());
  M40_CUDA_CHECK(cudaMemcpy(h.data(), d.get(), d.bytes(), cudaMemcpyDeviceToHost));
  return h;
}

// All bytes 0xff: a NaN as float, a NaN as half. An output the kernel forgot
// to write shows up as NaN.
template <class T>
void poison(DeviceBuffer<T>& d) {
  M40_CUDA_CHECK(cudaMemset(d.get(), 0xff, d.bytes()));
}

inline std::vector<float> random_floats(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Expects |gpu - cpu| <= abs_tol + rel_tol * |cpu| everywhere (NaN fails),
// naming the first few elements that miss and the worst error.
inline void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu, double rel_tol,
                         double abs_tol, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  size_t bad = 0;
  double worst = 0.0;
  size_t worst_at = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double err = std::fabs(static_cast<double>(gpu[i]) - static_cast<double>(cpu[i]));
    const double tol = abs_tol + rel_tol * std::fabs(static_cast<double>(cpu[i]));
    if (!(err <= tol)) {  // NaN fails too
      if (++bad <= 5) ADD_FAILURE() << what << ": element " << i << ": GPU " << gpu[i] << ", CPU " << cpu[i];
    }
    if (err > worst || std::isnan(err)) {
      worst = std::isnan(err) ? INFINITY : err;
      worst_at = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": worst |error| " << worst << " at element " << worst_at;
  // M40_REPORT_ERRORS=1 prints the worst error of every comparison.
  if (std::getenv("M40_REPORT_ERRORS") != nullptr) {
    std::printf("  %s: worst |error| %.3g (tolerance %.3g + %.3g x |cpu|)\n", what.c_str(), worst, abs_tol, rel_tol);
  }
}

}  // namespace m40::test
