// CUDA matmul throughput against the limits measured in the same run:
//
// - copy bandwidth: cudaMemcpy device to device of 256 MB, bytes read plus
//   bytes written per second (what a kernel that streams memory can reach);
// - FP32 FMA peak: a kernel of independent FMA chains (2 FLOP per FMA).
//
// matvec (decode): achieved GB/s = (weight bytes + x bytes + y bytes) / time,
// for the layer shapes of a 7B llama (4096x4096, 11008x4096, 4096x11008) at
// batch 1, 8 and 32. gemm (prefill): GFLOP/s = 2 rows cols tokens / time at
// 512 tokens. Times are CUDA-event medians over many launches after a
// warm-up; each launch uses the next of several copies of W, x and y whose
// total is at least twice the L2 cache, so W comes from DRAM as it does in a
// real forward pass. Prints markdown tables; a third one times the kernels
// behind each batch size (matvec kernel, decode-tile gemm, prefill-tile gemm)
// through the internal launchers. `--profile [N]` runs one product of N tokens
// (default 1) each of F16, Q8_0 and Q4_K at 11008x4096 and nothing else, for
// ncu (512: the prefill gemm); `--quick` only the decode table of F16, Q8_0, Q4_K and Q4_0;
// `--choice` only the kernel-choice table; `--skinny` the Q4_K skinny kernel
// (matmul_skinny.cu) against the matvec kernel and the decode tile; `--small` (`--mid`) only the
// decode table, every type, at 1 and 2 (4, 8 and 16) tokens; `--gemm` only
// the prefill table. `--types Q8_0,F16` after any of these limits the decode
// table to those types.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/matmul.h"
#include "backends/cuda/matmul_internal.cuh"
#include "common/error.h"
#include "gguf/tensor_type.h"
#include "quant/block_types.h"
#include "quant/fp16.h"
#include "cuda_bench_common.cuh"

namespace {

using m40::cuda::DeviceWeight;
using m40::gguf::TensorType;

// ---------------------------------------------------------------------------
// Timing

class Events {
 public:
  Events() {
    M40_CUDA_CHECK(cudaEventCreate(&start_));
    M40_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~Events() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  void start(cudaStream_t s) { M40_CUDA_CHECK(cudaEventRecord(start_, s)); }
  double stop_ms(cudaStream_t s) {
    M40_CUDA_CHECK(cudaEventRecord(stop_, s));
    M40_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    M40_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median time of one call of `body(i)` in ms: `reps` rounds of `per_round`
// back-to-back calls (i = 0, 1, ... cycling the buffers), after a warm-up.
template <class Body>
double time_ms(cudaStream_t stream, int per_round, int reps, Body&& body) {
  for (int i = 0; i < std::max(3, per_round); ++i) body(i);
  M40_CUDA_CHECK(cudaStreamSynchronize(stream));
  Events events;
  std::vector<double> times;
  int call = 0;
  for (int r = 0; r < reps; ++r) {
    events.start(stream);
    for (int i = 0; i < per_round; ++i) body(call++);
    times.push_back(events.stop_ms(stream) / per_round);
  }
  return median(times);
}

// The same, with each round's calls captured once into a CUDA graph and the
// graph replayed: how the products run inside a decode step, whose graph
// launches them without the host's per-launch cost between them.
template <class Body>
double time_graph_ms(cudaStream_t stream, int per_round, int reps, Body&& body) {
  cudaGraphExec_t exec = m40::bench::capture_graph(stream, [&] {
    for (int i = 0; i < per_round; ++i) body(i);
  });
  const double ms = time_ms(stream, 1, reps, [&](int) { M40_CUDA_CHECK(cudaGraphLaunch(exec, stream)); });
  cudaGraphExecDestroy(exec);
  return ms / per_round;
}

template <class T>
struct DeviceArray {
  explicit DeviceArray(size_t n) : count(n) { M40_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data), n * sizeof(T))); }
  ~DeviceArray() { cudaFree(data); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* data = nullptr;
  size_t count = 0;
};

// ---------------------------------------------------------------------------
// The limits

double copy_bandwidth_gb_per_s(cudaStream_t stream) {
  const size_t bytes = size_t{256} << 20;
  DeviceArray<uint8_t> a(bytes), b(bytes);
  M40_CUDA_CHECK(cudaMemset(a.data, 1, bytes));
  const double ms = time_ms(stream, 1, 15, [&](int) {
    M40_CUDA_CHECK(cudaMemcpyAsync(b.data, a.data, bytes, cudaMemcpyDeviceToDevice, stream));
  });
  return 2.0 * static_cast<double>(bytes) / (ms * 1e6);
}

// A kernel that only reads: each thread loads kReadLoads 16-byte words (all
// issued before any is used) of a buffer and folds them into one word per
// block. Timed over the byte count of a weight matrix, it says what a single
// launch that reads that many bytes can reach on this GPU: small products
// pay the launch, the first latency and the last wave in full.
constexpr int kReadThreads = 256;
constexpr int kReadLoads = 4;

__global__ void read_kernel(const uint4* __restrict__ data, size_t words, unsigned* out) {
  const size_t first = (static_cast<size_t>(blockIdx.x) * kReadThreads * kReadLoads) + threadIdx.x;
  uint4 v[kReadLoads];
#pragma unroll
  for (int i = 0; i < kReadLoads; ++i) {
    const size_t index = first + static_cast<size_t>(i) * kReadThreads;
    v[i] = index < words ? __ldg(data + index) : make_uint4(0, 0, 0, 0);
  }
  unsigned folded = 0;
#pragma unroll
  for (int i = 0; i < kReadLoads; ++i) folded ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
  if (folded == 0x9E3779B9u) out[blockIdx.x] = folded;  // keeps the loads; almost never stores
}

void launch_read(const uint8_t* data, size_t bytes, unsigned* out, cudaStream_t stream) {
  const size_t words = bytes / 16;
  const size_t per_block = static_cast<size_t>(kReadThreads) * kReadLoads;
  const unsigned blocks = static_cast<unsigned>((words + per_block - 1) / per_block);
  read_kernel<<<blocks, kReadThreads, 0, stream>>>(reinterpret_cast<const uint4*>(data), words, out);
  M40_CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------
// Random valid weights (fast: splitmix64 bytes, then finite fp16 scales)

struct Random {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>(next() >> 40) * (2.0f / 16777216.0f) - 1.0f; }  // [-1, 1)
};

size_t row_bytes_of(TensorType type, int64_t cols) {
  const auto& traits = m40::gguf::tensor_type_traits(type);
  return static_cast<size_t>(cols / traits.block_size * traits.bytes_per_block);
}

std::vector<uint8_t> random_weight(TensorType type, int64_t rows, int64_t cols) {
  Random rng{42};
  const size_t bytes = row_bytes_of(type, cols) * static_cast<size_t>(rows);
  std::vector<uint8_t> data(bytes);
  const size_t values = static_cast<size_t>(rows * cols);
  if (type == TensorType::F32) {
    for (size_t i = 0; i < values; ++i) {
      const float v = rng.uniform();
      std::memcpy(data.data() + 4 * i, &v, 4);
    }
  } else if (type == TensorType::F16 || type == TensorType::BF16) {
    for (size_t i = 0; i < values; ++i) {
      const float v = rng.uniform();
      const uint16_t h = type == TensorType::F16 ? m40::quant::float_to_half(v) : m40::quant::float_to_bf16(v);
      std::memcpy(data.data() + 2 * i, &h, 2);
    }
  } else {
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
      const uint64_t r = rng.next();
      std::memcpy(data.data() + i, &r, 8);
    }
    m40::quant::visit_block_type(type, [&](auto tag) {
      using Block = typename decltype(tag)::type;
      auto half = [&] { return m40::quant::float_to_half(0.01f + 0.02f * std::fabs(rng.uniform())); };
      for (size_t off = 0; off + sizeof(Block) <= bytes; off += sizeof(Block)) {
        Block b;
        std::memcpy(&b, data.data() + off, sizeof b);
        b.d = half();
        if constexpr (std::is_same_v<Block, m40::quant::BlockQ4_1> || std::is_same_v<Block, m40::quant::BlockQ5_1>) {
          b.m = half();
        }
        if constexpr (std::is_same_v<Block, m40::quant::BlockQ2_K> || std::is_same_v<Block, m40::quant::BlockQ4_K> ||
                      std::is_same_v<Block, m40::quant::BlockQ5_K>) {
          b.dmin = half();
        }
        std::memcpy(data.data() + off, &b, sizeof b);
      }
    });
  }
  return data;
}

// Several copies of W, x and y, enough to overflow the L2 cache twice.
struct Buffers {
  Buffers(TensorType type, int64_t rows, int64_t cols, int max_tokens, size_t l2_bytes)
      : weight_bytes(row_bytes_of(type, cols) * static_cast<size_t>(rows)),
        x_floats(static_cast<size_t>(max_tokens) * static_cast<size_t>(cols)),
        y_floats(static_cast<size_t>(max_tokens) * static_cast<size_t>(rows)) {
    const size_t per_copy = weight_bytes + 4 * (x_floats + y_floats);
    copies = static_cast<int>(std::max<size_t>(2, (2 * l2_bytes + per_copy - 1) / per_copy));
    weights = std::make_unique<DeviceArray<uint8_t>>(weight_bytes * copies);
    xs = std::make_unique<DeviceArray<float>>(x_floats * copies);
    ys = std::make_unique<DeviceArray<float>>(y_floats * copies);
    const std::vector<uint8_t> host = random_weight(type, rows, cols);
    M40_CUDA_CHECK(cudaMemcpy(weights->data, host.data(), weight_bytes, cudaMemcpyHostToDevice));
    for (int c = 1; c < copies; ++c) {
      M40_CUDA_CHECK(
          cudaMemcpy(weights->data + c * weight_bytes, weights->data, weight_bytes, cudaMemcpyDeviceToDevice));
    }
    std::vector<float> x(x_floats * copies);
    Random rng{7};
    for (auto& v : x) v = rng.uniform();
    M40_CUDA_CHECK(cudaMemcpy(xs->data, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    weight.type = type;
    weight.rows = rows;
    weight.cols = cols;
    weight.row_bytes = row_bytes_of(type, cols);
  }
  DeviceWeight copy(int i) const {
    DeviceWeight w = weight;
    w.data = weights->data + static_cast<size_t>(i % copies) * weight_bytes;
    return w;
  }
  const float* x(int i) const { return xs->data + static_cast<size_t>(i % copies) * x_floats; }
  float* y(int i) const { return ys->data + static_cast<size_t>(i % copies) * y_floats; }

  size_t weight_bytes, x_floats, y_floats;
  int copies = 2;
  DeviceWeight weight;
  std::unique_ptr<DeviceArray<uint8_t>> weights;
  std::unique_ptr<DeviceArray<float>> xs, ys;
};

struct Shape {
  int64_t rows, cols;
};

}  // namespace

// The internal launchers' argument for copy i of buf (a shape x cols
// product of n tokens).
m40::cuda::mm::Product internal_product(const Buffers& buf, TensorType type, const Shape& shape, int i, int n,
                                        cudaStream_t stream) {
  m40::cuda::mm::Product p;
  p.type = type;
  p.w = static_cast<const uint8_t*>(buf.copy(i).data);
  p.row_bytes = buf.weight.row_bytes;
  p.rows = static_cast<int>(shape.rows);
  p.cols = static_cast<int>(shape.cols);
  p.x = buf.x(i);
  p.n_tokens = n;
  p.y = buf.y(i);
  p.stream = stream;
  return p;
}

// --profile N: one product each of F16, Q8_0 and Q4_K (11008 x 4096, N tokens,
// through matmul(): the matvec kernel up to 16 tokens, the gemm kernel above)
// and nothing else, for a profiler (ncu --kernel-name regex:matvec|gemm).
int profile_only(int n_tokens) {
  cudaStream_t stream;
  M40_CUDA_CHECK(cudaStreamCreate(&stream));
  for (const TensorType type : {TensorType::F16, TensorType::Q8_0, TensorType::Q4_K}) {
    const Buffers buf(type, 11008, 4096, n_tokens, 0);
    m40::cuda::matmul(buf.copy(0), buf.x(0), n_tokens, buf.y(0), nullptr, stream);
  }
  M40_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
  return 0;
}

int main(int argc, char** argv) {
  try {
    if (argc > 1 && std::string(argv[1]) == "--profile") return profile_only(argc > 2 ? std::atoi(argv[2]) : 1);
    // --quick: the decode table of the types and batches the floors are about.
    const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
    // --choice: only the kernel-choice table (for tuning the small-batch tiles).
    const bool choice_only = argc > 1 && std::string(argv[1]) == "--choice";
    // --small / --mid: only the decode table, every type, at 1 and 2 / 4, 8
    // and 16 tokens.
    const bool small_only = argc > 1 && std::string(argv[1]) == "--small";
    const bool mid_only = argc > 1 && std::string(argv[1]) == "--mid";
    // --skinny: only the skinny Q4_K kernel against the kernels before it.
    const bool skinny_only = argc > 1 && std::string(argv[1]) == "--skinny";
    // --gemm: only the prefill table.
    const bool gemm_only = argc > 1 && std::string(argv[1]) == "--gemm";
    int device = 0;
    M40_CUDA_CHECK(cudaGetDevice(&device));
    cudaDeviceProp prop{};
    M40_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    cudaStream_t stream;
    M40_CUDA_CHECK(cudaStreamCreate(&stream));

    const double copy_gbps = copy_bandwidth_gb_per_s(stream);
    const double fma_gflops = m40::bench::fma_peak_gflop_per_s(prop.multiProcessorCount);
    std::printf("device: %s (sm_%d%d, %d SMs, %.0f MB L2)\n", prop.name, prop.major, prop.minor,
                prop.multiProcessorCount, prop.l2CacheSize / 1048576.0);
    std::printf("copy bandwidth (cudaMemcpy D2D, read + write): %.1f GB/s\n", copy_gbps);
    std::printf("FP32 FMA peak (FMA-loop kernel): %.0f GFLOP/s\n\n", fma_gflops);

    const size_t l2 = static_cast<size_t>(prop.l2CacheSize);
    const std::vector<Shape> shapes = {{4096, 4096}, {11008, 4096}, {4096, 11008}};
    std::vector<TensorType> matvec_types = {TensorType::F16,  TensorType::Q8_0, TensorType::Q4_K,
                                                  TensorType::Q4_0, TensorType::Q5_K, TensorType::Q6_K,
                                                  TensorType::IQ4_NL, TensorType::BF16, TensorType::F32,
                                                  TensorType::Q3_K, TensorType::Q2_K, TensorType::IQ4_XS,
                                                  TensorType::Q4_1, TensorType::Q5_0, TensorType::Q5_1};
    std::vector<int> batches = {1, 8, 32};
    if (quick) matvec_types.resize(4);  // F16, Q8_0, Q4_K, Q4_0
    for (int i = 1; i + 1 < argc; ++i) {
      if (std::string(argv[i]) != "--types") continue;
      matvec_types.clear();
      std::string list = argv[i + 1];
      for (size_t start = 0; start <= list.size();) {
        const size_t comma = std::min(list.find(',', start), list.size());
        const std::string name = list.substr(start, comma - start);
        const auto type = m40::gguf::tensor_type_from_name(name);
        if (!type) throw m40::Error("--types: unknown type '" + name + "'");
        matvec_types.push_back(*type);
        start = comma + 1;
      }
    }
    if (small_only) batches = {1, 2};
    if (mid_only) batches = {4, 8, 16};

    if (!choice_only && !gemm_only && !skinny_only) {
    std::printf("### matvec (decode): achieved GB/s and %% of copy bandwidth\n\n");
    std::printf("| rows x cols | type | batch | us | GB/s | %% of copy | in a graph: us, %% | read-only kernel, same bytes: us, %% of copy | read-only in a graph: us, %% |\n");
    std::printf("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    DeviceArray<unsigned> read_out(size_t{1} << 20);
    for (const Shape& shape : shapes) {
      for (const TensorType type : matvec_types) {
        const Buffers buf(type, shape.rows, shape.cols, 32, l2);
        const double read_ms = time_ms(stream, buf.copies, 25, [&](int i) {
          launch_read(static_cast<const uint8_t*>(buf.copy(i).data), buf.weight_bytes, read_out.data, stream);
        });
        const double read_graph_ms = time_graph_ms(stream, buf.copies, 25, [&](int i) {
          launch_read(static_cast<const uint8_t*>(buf.copy(i).data), buf.weight_bytes, read_out.data, stream);
        });
        auto read_percent = [&](double ms) {
          return 100.0 * static_cast<double>(buf.weight_bytes) / (ms * 1e6) / copy_gbps;
        };
        for (const int n : batches) {
          auto product = [&](int i) { m40::cuda::matvec(buf.copy(i), buf.x(i), n, buf.y(i), nullptr, stream); };
          const double ms = time_ms(stream, buf.copies, 25, product);
          const double graph_ms = time_graph_ms(stream, buf.copies, 25, product);
          const double bytes = static_cast<double>(buf.weight_bytes) +
                               4.0 * n * static_cast<double>(shape.cols + shape.rows);
          auto percent = [&](double t) { return 100.0 * bytes / (t * 1e6) / copy_gbps; };
          std::printf("| %lldx%lld | %s | %d | %.1f | %.1f | %.0f%% | %.1f, %.0f%% | %.1f, %.0f%% | %.1f, %.0f%% |\n",
                      static_cast<long long>(shape.rows), static_cast<long long>(shape.cols),
                      std::string(m40::gguf::tensor_type_name(type)).c_str(), n, ms * 1e3, bytes / (ms * 1e6),
                      percent(ms), graph_ms * 1e3, percent(graph_ms), read_ms * 1e3, read_percent(read_ms),
                      read_graph_ms * 1e3, read_percent(read_graph_ms));
        }
      }
    }

    }
    if (quick || small_only || mid_only) return 0;

    if (skinny_only) {
      // The skinny kernel (Q4_K, eight rows a lane; 16 and 32 tokens as
      // launches of 8) against the matvec kernel and the decode tile.
      std::printf("### skinny Q4_K kernel against the kernels before it (us per product)\n\n");
      std::printf("| rows x cols | batch | matvec kernel | decode tile | skinny, launches of 8 | skinny GFLOP/s, %% of FMA peak |\n");
      std::printf("| --- | ---: | ---: | ---: | ---: | ---: |\n");
      for (const Shape& shape : shapes) {
        const Buffers buf(TensorType::Q4_K, shape.rows, shape.cols, 32, l2);
        auto product = [&](int i, int n) { return internal_product(buf, TensorType::Q4_K, shape, i, n, stream); };
        for (const int n : {4, 8, 12, 16, 24, 32}) {
          std::string matvec_us = "-";
          if (n <= m40::cuda::mm::kMaxMatvecKernelTokens) {
            const double ms = time_graph_ms(stream, buf.copies, 15, [&](int i) { m40::cuda::mm::launch_matvec_kernel(product(i, n)); });
            matvec_us = std::to_string(ms * 1e3).substr(0, 6);
          }
          const double tile_ms =
              time_graph_ms(stream, buf.copies, 15, [&](int i) { m40::cuda::mm::launch_gemm_decode(product(i, n)); });
          // The skinny kernel in launches of up to 8 tokens.
          const double skinny_ms = time_graph_ms(stream, buf.copies, 15, [&](int i) {
            const auto p = product(i, n);
            for (int t = 0; t < n; t += m40::cuda::mm::kMaxSkinnyTokens) {
              m40::cuda::mm::launch_skinny(p.token_slice(t, std::min(n - t, m40::cuda::mm::kMaxSkinnyTokens)));
            }
          });
          const double gflops = 2.0 * static_cast<double>(shape.rows) * static_cast<double>(shape.cols) * n /
                                (skinny_ms * 1e6);
          std::printf("| %lldx%lld | %d | %s | %.1f | %.1f | %.0f, %.0f%% |\n", static_cast<long long>(shape.rows),
                      static_cast<long long>(shape.cols), n, matvec_us.c_str(), tile_ms * 1e3, skinny_ms * 1e3,
                      gflops, 100.0 * gflops / fma_gflops);
        }
      }
      return 0;
    }

    if (!gemm_only) {
    // Which kernel suits which batch: the matvec kernel (up to 16 tokens),
    // the gemm kernel with one decode token tile (16 or 32), and the prefill
    // tile.
    std::printf("\n### kernel choice by batch size (us per product)\n\n");
    std::printf("| rows x cols | type | batch | matvec kernel | gemm, decode tile | gemm, prefill tile |\n");
    std::printf("| --- | --- | ---: | ---: | ---: | ---: |\n");
    for (const Shape& shape : {shapes[0], shapes[1]}) {
      for (const TensorType type : {TensorType::F16, TensorType::Q8_0, TensorType::Q4_K, TensorType::Q3_K,
                                    TensorType::Q5_0, TensorType::Q4_1, TensorType::IQ4_XS}) {
        const Buffers buf(type, shape.rows, shape.cols, 32, l2);
        auto product = [&](int i, int n) { return internal_product(buf, type, shape, i, n, stream); };
        for (const int n : {4, 8, 12, 16, 24, 32}) {
          std::string matvec_us = "-";
          if (n <= m40::cuda::mm::kMaxMatvecKernelTokens) {
            const double ms = time_ms(stream, buf.copies, 15, [&](int i) { m40::cuda::mm::launch_matvec(product(i, n)); });
            matvec_us = std::to_string(ms * 1e3).substr(0, 6);
          }
          const double decode_ms =
              time_ms(stream, buf.copies, 15, [&](int i) { m40::cuda::mm::launch_gemm_decode(product(i, n)); });
          const double prefill_ms =
              time_ms(stream, buf.copies, 15, [&](int i) { m40::cuda::mm::launch_gemm(product(i, n)); });
          std::printf("| %lldx%lld | %s | %d | %s | %.1f | %.1f |\n", static_cast<long long>(shape.rows),
                      static_cast<long long>(shape.cols), std::string(m40::gguf::tensor_type_name(type)).c_str(), n,
                      matvec_us.c_str(), decode_ms * 1e3, prefill_ms * 1e3);
        }
      }
    }
    }
    if (choice_only) return 0;

    std::printf("\n### gemm (prefill, 512 tokens): GFLOP/s and %% of FMA peak\n\n");
    std::printf("| rows x cols | type | tokens | ms | GFLOP/s | %% of FMA peak |\n");
    std::printf("| --- | --- | ---: | ---: | ---: | ---: |\n");
    const std::vector<TensorType> gemm_types = {TensorType::F16, TensorType::Q8_0, TensorType::Q4_K, TensorType::Q4_0,
                                                TensorType::Q6_K, TensorType::F32, TensorType::Q3_K, TensorType::Q2_K,
                                                TensorType::IQ4_XS, TensorType::Q5_0};
    constexpr int kPrefill = 512;
    auto time_gemm = [&](const Shape& shape, TensorType type, int tokens) {
      const Buffers buf(type, shape.rows, shape.cols, tokens, l2);
      const double ms = time_ms(stream, buf.copies, 7, [&](int i) {
        m40::cuda::gemm(buf.copy(i), buf.x(i), tokens, buf.y(i), nullptr, stream);
      });
      const double gflops = 2.0 * shape.rows * shape.cols * tokens / (ms * 1e6);
      std::printf("| %lldx%lld | %s | %d | %.3f | %.0f | %.0f%% |\n", static_cast<long long>(shape.rows),
                  static_cast<long long>(shape.cols), std::string(m40::gguf::tensor_type_name(type)).c_str(), tokens,
                  ms, gflops, 100.0 * gflops / fma_gflops);
    };
    for (const Shape& shape : shapes) {
      for (const TensorType type : gemm_types) time_gemm(shape, type, kPrefill);
    }
    // Server-sized prompt chunks (--prefill-chunk 256 by default) and shorter
    // prompts: fewer token tiles to fill the GPU with.
    std::printf("\n| rows x cols | type | tokens | ms | GFLOP/s | %% of FMA peak |\n| --- | --- | ---: | ---: | ---: | ---: |\n");
    for (const Shape& shape : shapes) {
      for (const TensorType type : {TensorType::F16, TensorType::Q4_K}) {
        for (const int tokens : {128, 256}) time_gemm(shape, type, tokens);
      }
    }
    cudaStreamDestroy(stream);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_matmul: %s\n", e.what());
    return 1;
  }
  return 0;
}
