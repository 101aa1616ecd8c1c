// What the CUDA benchmark programs share: random device data, timing with
// CUDA events, and the device-to-device copy bandwidth (the practical
// ceiling the bandwidth-bound kernels are compared with).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>

#include "backends/cuda/cuda_check.h"
#include "quant/fp16.h"

namespace m40::bench {

__device__ inline uint32_t hash32(uint64_t i) {
  uint32_t x = static_cast<uint32_t>(i) * 0x9E3779B1u ^ static_cast<uint32_t>(i >> 32);
  x ^= x >> 16;
  x *= 0x85EBCA6Bu;
  x ^= x >> 13;
  x *= 0xC2B2AE35u;
  x ^= x >> 16;
  return x;
}

// Uniform values in [-1, 1), as FP16 bits or floats.
static __global__ void fill_halves(uint16_t* dst, int64_t n, uint32_t seed) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float u = static_cast<float>(hash32(static_cast<uint64_t>(i) + seed) >> 8) * (1.0f / 16777216.0f);
    dst[i] = m40::quant::float_to_half(2.0f * u - 1.0f);
  }
}

static __global__ void fill_floats(float* dst, int64_t n, uint32_t seed) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = static_cast<float>(hash32(static_cast<uint64_t>(i) + seed) >> 8) * (2.0f / 16777216.0f) - 1.0f;
  }
}

template <class T>
T* device_alloc(size_t count) {
  T* p = nullptr;
  M40_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), count * sizeof(T)));
  return p;
}

// Milliseconds per call of fn, averaged over `iterations` after two warm-ups.
template <class Fn>
double time_ms(int iterations, Fn&& fn) {
  cudaEvent_t start, stop;
  M40_CUDA_CHECK(cudaEventCreate(&start));
  M40_CUDA_CHECK(cudaEventCreate(&stop));
  fn();
  fn();
  M40_CUDA_CHECK(cudaEventRecord(start));
  for (int i = 0; i < iterations; ++i) fn();
  M40_CUDA_CHECK(cudaEventRecord(stop));
  M40_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0.0f;
  M40_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  M40_CUDA_CHECK(cudaEventDestroy(start));
  M40_CUDA_CHECK(cudaEventDestroy(stop));
  return static_cast<double>(ms) / iterations;
}

// The calls capture() makes on `stream`, captured once into a CUDA graph
// and instantiated (the caller destroys it).
template <class Capture>
cudaGraphExec_t capture_graph(cudaStream_t stream, Capture&& capture) {
  cudaGraph_t graph = nullptr;
  M40_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  capture();
  M40_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiateWithFlags(&exec, graph, 0);
  cudaGraphDestroy(graph);
  M40_CUDA_CHECK(instantiated);
  return exec;
}

// Milliseconds per call of fn(stream) when `per_graph` calls are captured
// once into a CUDA graph on a stream of their own and the graph is replayed
// `iterations` times: how kernels run inside a decode step, without the
// host's per-launch cost between them. fn runs once uncaptured first.
template <class Fn>
double time_in_graph_ms(int iterations, int per_graph, Fn&& fn) {
  cudaStream_t stream = nullptr;
  M40_CUDA_CHECK(cudaStreamCreate(&stream));
  fn(stream);
  cudaGraphExec_t exec = capture_graph(stream, [&] {
    for (int i = 0; i < per_graph; ++i) fn(stream);
  });
  const double ms = time_ms(iterations, [&] { M40_CUDA_CHECK(cudaGraphLaunch(exec, stream)); });
  M40_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraphExecDestroy(exec);
  M40_CUDA_CHECK(cudaStreamDestroy(stream));
  return ms / per_graph;
}

// GB/s of a 512 MiB device-to-device copy, bytes read plus written.
inline double copy_bandwidth_gb_per_s() {
  const size_t bytes = size_t{512} << 20;
  char* src = device_alloc<char>(bytes);
  char* dst = device_alloc<char>(bytes);
  M40_CUDA_CHECK(cudaMemset(src, 1, bytes));
  const double ms = time_ms(10, [&] { M40_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); });
  M40_CUDA_CHECK(cudaFree(src));
  M40_CUDA_CHECK(cudaFree(dst));
  return 2.0 * static_cast<double>(bytes) / (ms * 1e6);
}

// Prints the device and its copy bandwidth (the table header every CUDA
// benchmark starts with); returns the bandwidth.
inline double print_device_and_copy_bandwidth() {
  cudaDeviceProp prop{};
  M40_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d, %d SMs)\n\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  const double gbs = copy_bandwidth_gb_per_s();
  std::printf("copy bandwidth (read + write): %.1f GB/s\n\n", gbs);
  return gbs;
}

// The FP32 FMA peak: 8 blocks of 256 threads per SM, each thread running
// 8 independent FMA chains (2 FLOP per FMA); GFLOP/s. The ceiling the
// FP32-bound products are measured against.
constexpr int kFmaChains = 8;
constexpr int kFmaUnroll = 16;

static __global__ void fma_peak_kernel(float* out, int iterations, float a, float b) {
  float r[kFmaChains];
#pragma unroll
  for (int c = 0; c < kFmaChains; ++c) r[c] = static_cast<float>(threadIdx.x + c);
  for (int i = 0; i < iterations; ++i) {
#pragma unroll
    for (int u = 0; u < kFmaUnroll; ++u) {
#pragma unroll
      for (int c = 0; c < kFmaChains; ++c) r[c] = fmaf(r[c], a, b);
    }
  }
  float sum = 0;
#pragma unroll
  for (int c = 0; c < kFmaChains; ++c) sum += r[c];
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

inline double fma_peak_gflop_per_s(int sms) {
  const int threads = 256, blocks = sms * 8, iterations = 4096;
  float* out = device_alloc<float>(static_cast<size_t>(threads) * blocks);
  const double ms = time_ms(9, [&] {
    fma_peak_kernel<<<blocks, threads>>>(out, iterations, 0.999f, 0.001f);
    M40_CUDA_CHECK_LAUNCH();
  });
  M40_CUDA_CHECK(cudaFree(out));
  const double flop = 2.0 * kFmaChains * kFmaUnroll * static_cast<double>(iterations) * threads * blocks;
  return flop / (ms * 1e6);
}

}  // namespace m40::bench
