// prefill_plan.h: the prefill gemm's choice of tile and K splits.
#include "backends/cuda/prefill_plan.h"

#include <algorithm>
#include <cstdint>

namespace m40::cuda::mm {

namespace {

// The split model (prefill_splits): the tile's FMA rate over the copy
// bandwidth, in FLOP per byte of partial sums (about half the FMA peak over
// the copy bandwidth: 11 on an H100, 12 on an M40); and the least gain a
// split must promise (it also pays the reduce's launch and the parts' own
// prologues).
constexpr double kFlopPerPartialByte = 11.0;
constexpr double kMinSplitGain = 0.95;

int64_t tiles_of(const PrefillTile& tile, int rows, int n_tokens) {
  return int64_t{(rows + tile.rows - 1) / tile.rows} * ((n_tokens + tile.tokens - 1) / tile.tokens);
}

}  // namespace

// Parts multiply the blocks, so a product whose tiles fill a fraction of a
// wave (a 4096-row matrix at 128 tokens is 64 tiles of 128 x 64 for an
// H100's 264 block slots) or leave its last wave ragged (11008 rows at 128
// tokens: 172 tiles, 0.65 of a wave) keeps every SM busy; each part writes,
// and the reduce reads back, tokens x rows floats. In FLOP: waves(s) / s x
// one full wave's FMAs + s x the partial bytes x kFlopPerPartialByte, for
// s = 1 to 16 parts of at least 4 K steps each, the cheapest kept where it
// saves a twentieth.
int prefill_splits(const PrefillTile& tile, int rows, int cols, int n_tokens, int sms) {
  const int64_t tiles = tiles_of(tile, rows, n_tokens);
  const int64_t slots = int64_t{tile.blocks_per_sm} * sms;
  if (tiles <= 0 || slots <= 0) return 1;
  const double wave_flop =
      2.0 * tile.rows * tile.tokens * static_cast<double>(cols) * static_cast<double>(slots);
  const double partial_bytes = 2.0 * sizeof(float) * static_cast<double>(n_tokens) * rows;  // written, read
  const int max_splits = std::min(16, cols / tile.k_step / 4);
  const double unsplit_cost = static_cast<double>((tiles + slots - 1) / slots) * wave_flop;
  int best = 1;
  double best_cost = unsplit_cost;
  for (int s = 2; s <= max_splits; ++s) {
    const double waves = static_cast<double>((tiles * s + slots - 1) / slots);
    const double cost = waves / s * wave_flop + s * partial_bytes * kFlopPerPartialByte;
    if (cost < best_cost) best = s, best_cost = cost;
  }
  return best_cost <= kMinSplitGain * unsplit_cost ? best : 1;
}

// The 128-token tile when its waves (a block per SM) are nearly full: whole
// waves cost less than 1.3 times the tiles' share of the SMs, which is about
// what the 128 x 64 tile's twice as many blocks take for the same work on an
// H200 (4096 rows, 256 tokens: 64 blocks of 128 x 128 for 132 SMs took 0.44
// ms, 128 of 128 x 64 0.28; 11008 rows: 172 blocks 0.92 ms against 0.83; 512
// tokens: 0.47 against 0.55 and 1.38 against 1.61).
PrefillPlan plan_prefill(int rows, int cols, int n_tokens, int sms, bool can_split) {
  PrefillPlan plan;
  const int64_t wide_tiles = tiles_of(kWidePrefillTile, rows, n_tokens);
  const int64_t waves = (wide_tiles + sms - 1) / sms;
  plan.wide = n_tokens > kShortPrefillTile.tokens && 10 * waves * sms < 13 * wide_tiles;
  if (can_split) {
    plan.splits = prefill_splits(plan.wide ? kWidePrefillTile : kShortPrefillTile, rows, cols, n_tokens, sms);
  }
  return plan;
}

// Costs in 32-token decode-tile passes, measured end to end on an H100
// (Llama-2-7B shape, Q4_K_M, F16 and Q8_0, pp40 to pp96, 2026-11-27,
// docs/benchmarks.md): a 64-token prefill tile (K split where its
// waves are short) about 1.5 passes; a remainder of r <= 16 tokens, which
// the matvec and skinny kernels take, about r / 22 of a pass; 17 to 31
// tokens a whole pass. So 40 tokens (1.36 against 1.5) and 80 (2.73
// against 3) go in chunks, 48 (1.73 against 1.5), 64 (2 against 1.5) and
// 96 (3 against 3) to the prefill tile.
bool decode_chunks_beat_prefill(int n_tokens) {
  constexpr double kPrefillTilePasses = 1.5;
  constexpr double kMatvecPassPerToken = 1.0 / 22.0;
  constexpr int kChunk = 32;
  constexpr int kMaxMatvecRemainder = 16;
  const int remainder = n_tokens % kChunk;
  const double chunked = n_tokens / kChunk + (remainder == 0                       ? 0.0
                                              : remainder <= kMaxMatvecRemainder ? remainder * kMatvecPassPerToken
                                                                                 : 1.0);
  const double prefill = kPrefillTilePasses * ((n_tokens + kShortPrefillTile.tokens - 1) / kShortPrefillTile.tokens);
  return chunked < prefill;
}

}  // namespace m40::cuda::mm
