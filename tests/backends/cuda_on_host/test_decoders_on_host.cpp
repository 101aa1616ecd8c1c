// Every GPU matmul decoder (src/backends/cuda/matmul_decode.cuh), compiled
// by the host compiler with host_intrinsics.h, against its CPU twin
// quant::dequantize_value on random blocks: each value of each unit and
// piece, in the decode form (the gemm tiles, 3+ tokens) and in the factored
// form (scale * q - offset, 1 and 2 tokens), bit for bit; the units' columns
// cover the block once; no load leaves the block or is misaligned, at every
// row alignment matmul.cu's fast_path_fits lets through. The GPU tests
// (tests/backends/cuda) compare whole products on a GPU; this one runs in every build.
#include "host_intrinsics.h"
// (after the stand-ins it needs)
#include "backends/cuda/matmul_decode.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace m40::cuda::mm {
namespace {

template <class Dec, size_t kRowAlignment>
struct Case {
  using Decoder = Dec;
  static constexpr size_t kAlignment = kRowAlignment;
};

// The alignments fast_path_fits (matmul.cu) guarantees each type's rows.
using Cases = ::testing::Types<
    Case<DecodeF16, 16>, Case<DecodeBF16, 16>, Case<DecodeQ8_0, 2>, Case<DecodeQ4_0, 2>, Case<DecodeQ4_0Wide, 2>,
    Case<DecodeIQ4_NL, 2>, Case<DecodeIQ4_NLWide, 2>, Case<DecodeQ4_1, 4>, Case<DecodeQ5_0, 2>, Case<DecodeQ5_1, 2>,
    Case<DecodeQ2_K, 4>, Case<DecodeQ2_KWide, 4>, Case<DecodeQ3_K, 2>, Case<DecodeQ3_KWide, 2>, Case<DecodeQ4_K, 16>,
    Case<DecodeQ4_KWide, 16>, Case<DecodeQ5_K, 16>, Case<DecodeQ5_KWide, 16>, Case<DecodeQ6_K, 2>,
    Case<DecodeQ6_KWide, 2>, Case<DecodeIQ4_XS, 8>, Case<DecodeIQ4_XSWide, 8>>;

// The block a decoder reads, and its values per quant::dequantize_value.
template <class Dec>
struct BlockOf {
  using type = typename Dec::Block;
};
// The float types read 8 values (16 bytes) as their "block".
struct HalfBlock {
  static constexpr int kValues = 8;
  uint16_t v[8];
};
template <>
struct BlockOf<DecodeF16> {
  using type = HalfBlock;
};
template <>
struct BlockOf<DecodeBF16> {
  using type = HalfBlock;
};

template <class Dec>
float reference_value(const typename BlockOf<Dec>::type& b, int i) {
  if constexpr (std::is_same_v<Dec, DecodeF16>) return quant::half_to_float(b.v[i]);
  if constexpr (std::is_same_v<Dec, DecodeBF16>) return quant::bf16_to_float(b.v[i]);
  if constexpr (!std::is_same_v<Dec, DecodeF16> && !std::is_same_v<Dec, DecodeBF16>) {
    return quant::dequantize_value(b, i);
  }
}

// A finite half, mostly of moderate size, sometimes tiny (subnormal) or large.
uint16_t random_half(std::mt19937_64& rng) {
  const auto r = static_cast<uint32_t>(rng());
  const uint32_t exponent = (r & 3u) != 0 ? 5u + (r >> 2) % 20u : (r >> 2) % 31u;
  return static_cast<uint16_t>((r >> 31) << 15 | exponent << 10 | ((r >> 12) & 0x3FFu));
}

template <class Block>
Block random_block(std::mt19937_64& rng, int round) {
  Block b;
  auto* bytes = reinterpret_cast<uint8_t*>(&b);
  for (size_t i = 0; i < sizeof b; ++i) bytes[i] = static_cast<uint8_t>(rng());
  if (round % 61 == 1) std::memset(bytes, 0xFF, sizeof b);  // every quant at its top
  if (round % 61 == 2) std::memset(bytes, 0x00, sizeof b);
  if constexpr (std::is_same_v<Block, HalfBlock>) {
    for (auto& v : b.v) v = random_half(rng);
  } else {
    b.d = random_half(rng);
    if constexpr (requires { b.m; }) b.m = random_half(rng);
    if constexpr (requires { b.dmin; }) b.dmin = random_half(rng);
  }
  return b;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0 || (a == 0.0f && b == 0.0f); }

// Counts mismatches and keeps the first few descriptions.
struct Findings {
  long count = 0;
  std::ostringstream first;
  void add(const std::string& what) {
    if (count++ < 5) first << what << "\n";
  }
};

template <class Dec, int kPiece>
void check_piece(const typename BlockOf<Dec>::type& b, const typename Dec::Raw& raw, int unit, std::vector<int>& covered,
                 Findings& decode, Findings& factored) {
  using Block = typename BlockOf<Dec>::type;
  const int first = Dec::kUnit * unit + piece_offset<Dec>(unit, kPiece);
  for (int j = 0; j < 8; ++j) {
    if (first + j >= 0 && first + j < Block::kValues) ++covered[static_cast<size_t>(first + j)];
  }
  if (first < 0 || first + 8 > Block::kValues) return;  // reported by the coverage check
  auto where = [&](int j) {
    return "unit " + std::to_string(unit) + " piece " + std::to_string(kPiece) + " value " + std::to_string(first + j);
  };
  if constexpr (requires(float* w) { Dec::template decode<kPiece>(raw, unit, w); }) {
    float w[8];
    Dec::template decode<kPiece>(raw, unit, w);
    for (int j = 0; j < 8; ++j) {
      const float expected = reference_value<Dec>(b, first + j);
      if (!same_bits(w[j], expected)) {
        decode.add(where(j) + ": decoded " + std::to_string(w[j]) + ", CPU " + std::to_string(expected));
      }
    }
  }
  if constexpr (Dec::kFactored) {
    float q[8];
    Dec::template quants<kPiece>(raw, unit, q);
    constexpr int kPiecesPerGroup = Dec::kUnit / 8 / Dec::kScaleGroups;
    const float2 scale = Dec::unit_scale(raw, unit, kPiece / kPiecesPerGroup);
    for (int j = 0; j < 8; ++j) {
      float quant = q[j];
      if constexpr (Dec::kFractionQuants) {
        // 1/2 + q / F with q an integer 0..127: the kernel's dot(q', x) -
        // sum(x) / 2 is then exact in the quant.
        quant = (q[j] - 0.5f) * FractionScale<Dec>::value;
        if (!(q[j] >= 0.5f && q[j] < 1.0f) || quant != std::floor(quant) || quant >= 128.0f) {
          factored.add(where(j) + ": fraction quant " + std::to_string(q[j]));
          continue;
        }
      }
      const float value = quant::mul_unfused(scale.x, quant) - scale.y;
      const float expected = reference_value<Dec>(b, first + j);
      if (!same_bits(value, expected)) {
        factored.add(where(j) + ": scale * q - offset = " + std::to_string(value) + ", CPU " + std::to_string(expected));
      }
    }
  }
}

template <class Dec, int... kPieces>
void check_unit(const typename BlockOf<Dec>::type& b, const typename Dec::Raw& raw, int unit, std::vector<int>& covered,
                Findings& decode, Findings& factored, std::integer_sequence<int, kPieces...>) {
  (check_piece<Dec, kPieces>(b, raw, unit, covered, decode, factored), ...);
}

template <class C>
class GpuDecoderOnHost : public ::testing::Test {};
TYPED_TEST_SUITE(GpuDecoderOnHost, Cases);

TYPED_TEST(GpuDecoderOnHost, MatchesTheCpuTwinValueByValue) {
  using Dec = typename TypeParam::Decoder;
  using Block = typename BlockOf<Dec>::type;
  static_assert(Dec::kBlockBytes == sizeof(Block), "a decoder steps by whole blocks");
  static_assert(Dec::kUnit * Dec::kUnitsPerBlock == Block::kValues, "the units tile the block");
  if constexpr (HasSharedTable<Dec>::value) {
    for (unsigned t = 0; t < 128; ++t) {
      threadIdx.x = t;
      Dec::fill_table();
    }
  }
  std::mt19937_64 rng(1234);
  alignas(64) uint8_t buffer[512];
  Findings decode, factored, coverage;
  load_watch = {};
  for (int round = 0; round < 300; ++round) {
    const Block b = random_block<Block>(rng, round);
    for (size_t offset = 0; offset < 16; offset += TypeParam::kAlignment) {
      std::memset(buffer, 0xA5, sizeof buffer);
      uint8_t* block = buffer + 64 + offset;
      std::memcpy(block, &b, sizeof b);
      load_watch.first = block - reinterpret_cast<uintptr_t>(block) % 4;
      load_watch.end = block + sizeof b;
      std::vector<int> covered(Block::kValues, 0);
      for (int unit = 0; unit < Dec::kUnitsPerBlock; ++unit) {
        check_unit<Dec>(b, Dec::load(block, unit), unit, covered, decode, factored,
                        std::make_integer_sequence<int, Dec::kUnit / 8>{});
      }
      for (int i = 0; i < Block::kValues; ++i) {
        if (covered[static_cast<size_t>(i)] != 1) {
          coverage.add("value " + std::to_string(i) + " covered " + std::to_string(covered[static_cast<size_t>(i)]) +
                       " times");
        }
      }
    }
  }
  EXPECT_EQ(decode.count, 0) << decode.first.str();
  EXPECT_EQ(factored.count, 0) << factored.first.str();
  EXPECT_EQ(coverage.count, 0) << coverage.first.str();
  EXPECT_EQ(load_watch.outside, 0) << "loads outside the block";
  EXPECT_EQ(load_watch.misaligned, 0) << "loads not aligned to their size";
}

}  // namespace
}  // namespace m40::cuda::mm
