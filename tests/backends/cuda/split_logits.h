// What the tests of split models (test_cuda_stages.cpp, by layers;
// test_cuda_row_split.cpp, by rows) compare: every row of logits of a split
// model within the CUDA tests' tolerance of the whole model's on the CPU.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backends/backend.h"

namespace m40::test {

// The CUDA tests' bounds (test_cuda_backend.cpp): the llama models agree
// with the CPU within 2e-3, the architectures' tiny random models within 6e-3.
inline float split_tolerance_for(const std::string& model) { return model.rfind("arch/", 0) == 0 ? 6e-3f : 2e-3f; }

// One step's logits, poisoned (NaN) first so that an unwritten row fails.
inline std::vector<float> forward_logits(backend::Backend& b, const backend::Batch& batch) {
  std::vector<float> out(batch.logits_count() * static_cast<size_t>(b.n_vocab()), NAN);
  b.forward(batch, out);
  return out;
}

// Every row of `got` (n_vocab values each) within `tolerance` of `want`.
inline void expect_rows_close(const std::vector<float>& want, const std::vector<float>& got, size_t n_vocab,
                              float tolerance, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t r = 0; r < want.size() / n_vocab; ++r) {
    float worst = 0.0f;
    for (size_t i = 0; i < n_vocab; ++i) {
      const float d = std::isnan(got[r * n_vocab + i]) ? INFINITY : std::abs(want[r * n_vocab + i] - got[r * n_vocab + i]);
      worst = std::max(worst, d);
    }
    EXPECT_LE(worst, tolerance) << what << ", row " << r;
  }
}

}  // namespace m40::test
