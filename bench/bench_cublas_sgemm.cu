// cuBLAS SGEMM on this GPU: the FP32 matrix-product ceiling that the
// decode tiles and the prefill tile (matmul_gemm.cu) are measured against,
// beside the FP32 FMA peak of an FMA-loop kernel. The same products as
// bench_cuda_matmul's tables: y[tokens][rows] = x[tokens][cols] W^T with W
// FP32 rows x cols (llama 7B's 4096x4096, 11008x4096 and 4096x11008), at
// the token counts of a decode step (8 to 32), a mixed server step (64,
// 128) and a prompt (256, 512). cuBLAS runs in its pedantic math mode (no
// TF32 tensor-core shortcut: the same FP32 FMAs the M40 has). Times are
// CUDA-event averages after warm-ups; each call uses the next of several
// copies of W whose total is at least twice the L2 cache, so W comes from
// DRAM as in a forward pass. Prints a markdown table.
//
// The M40 build carries no cuBLAS; on a GPU machine build this against the
// CUDA there (docs/benchmarks.md, "Against cuBLAS SGEMM"):
//   nvcc -O3 -std=c++17 -arch=sm_90 -Isrc bench/bench_cublas_sgemm.cu -lcublas -o bench_cublas_sgemm
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cuda_bench_common.cuh"

namespace {

using m40::bench::device_alloc;
using m40::bench::fill_floats;
using m40::bench::fma_peak_gflop_per_s;
using m40::bench::time_ms;

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw m40::Error(std::string(what) + " failed: cuBLAS status " + std::to_string(static_cast<int>(status)));
  }
}

struct Shape {
  int rows;
  int cols;
};

}  // namespace

int main() {
  try {
    cudaDeviceProp prop{};
    M40_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    m40::bench::print_device_and_copy_bandwidth();
    const double fma_gflops = fma_peak_gflop_per_s(prop.multiProcessorCount);
    std::printf("FP32 FMA peak (FMA-loop kernel): %.0f GFLOP/s\n\n", fma_gflops);

    cublasHandle_t handle = nullptr;
    check_cublas(cublasCreate(&handle), "cublasCreate");
    check_cublas(cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");

    std::printf("### cuBLAS SGEMM: GFLOP/s and %% of FMA peak\n\n");
    std::printf("| rows x cols | tokens | ms | GFLOP/s | %% of FMA peak |\n| --- | ---: | ---: | ---: | ---: |\n");
    const std::vector<Shape> shapes = {{4096, 4096}, {11008, 4096}, {4096, 11008}};
    constexpr int kMaxTokens = 512;
    for (const Shape& shape : shapes) {
      const size_t w_count = static_cast<size_t>(shape.rows) * static_cast<size_t>(shape.cols);
      const size_t l2 = static_cast<size_t>(prop.l2CacheSize);
      const int copies = static_cast<int>(std::max<size_t>(2, (2 * l2 + w_count * 4 - 1) / (w_count * 4)));
      std::vector<float*> w(static_cast<size_t>(copies));
      for (float*& p : w) {
        p = device_alloc<float>(w_count);
        fill_floats<<<1024, 256>>>(p, static_cast<int64_t>(w_count), static_cast<uint32_t>(&p - w.data()));
        M40_CUDA_CHECK_LAUNCH();
      }
      float* x = device_alloc<float>(static_cast<size_t>(kMaxTokens) * static_cast<size_t>(shape.cols));
      float* y = device_alloc<float>(static_cast<size_t>(kMaxTokens) * static_cast<size_t>(shape.rows));
      fill_floats<<<1024, 256>>>(x, static_cast<int64_t>(kMaxTokens) * shape.cols, 7);
      M40_CUDA_CHECK_LAUNCH();
      for (const int tokens : {8, 16, 32, 64, 128, 256, 512}) {
        const float one = 1.0f, zero = 0.0f;
        int next = 0;
        // Column-major: y (rows x tokens) = W^T-as-stored (rows x cols) . x (cols x tokens).
        const double ms = time_ms(copies * 4, [&] {
          check_cublas(cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, shape.rows, tokens, shape.cols, &one,
                                   w[static_cast<size_t>(next)], shape.cols, x, shape.cols, &zero, y, shape.rows),
                       "cublasSgemm");
          next = (next + 1) % copies;
        });
        const double gflops = 2.0 * shape.rows * shape.cols * tokens / (ms * 1e6);
        std::printf("| %dx%d | %d | %.4f | %.0f | %.0f%% |\n", shape.rows, shape.cols, tokens, ms, gflops,
                    100.0 * gflops / fma_gflops);
      }
      for (float* p : w) M40_CUDA_CHECK(cudaFree(p));
      M40_CUDA_CHECK(cudaFree(x));
      M40_CUDA_CHECK(cudaFree(y));
    }
    cublasDestroy(handle);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cublas_sgemm: %s\n", e.what());
    return 1;
  }
  return 0;
}
