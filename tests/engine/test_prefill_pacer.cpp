// PrefillPacer against simulated step costs: what it allows with no stream
// or with pacing off, that it finds the chunk that fills the allowed step
// time on a linear cost model, and that it follows a cost cliff and a model
// that gets slower.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>

#include "engine/prefill_pacer.h"

using m40::engine::PrefillPacer;

namespace {

// Step seconds for n_decode decode tokens and n_prompt prompt tokens.
using Cost = std::function<double(int n_decode, int n_prompt)>;

// t = 2 ms + 0.5 ms per decode token + `per_prompt_ms` per prompt token.
Cost linear(double per_prompt_ms = 0.1) {
  return [per_prompt_ms](int d, int p) { return (2.0 + 0.5 * d + per_prompt_ms * p) * 1e-3; };
}

// Decode-only steps, as while streams run before a prompt arrives.
void run_decode_steps(PrefillPacer& pacer, const Cost& cost, int n_decode, int steps = 5) {
  for (int i = 0; i < steps; ++i) pacer.record(n_decode, 0, cost(n_decode, 0));
}

// Steps that carry what the pacer allows beside n_decode decode tokens, as
// while a long prompt is read (the pacer's decode-only reference steps
// included); returns the time of the last step that carried a prompt chunk.
double run_mixed_steps(PrefillPacer& pacer, const Cost& cost, int n_decode, int steps) {
  double seconds = 0;
  for (int i = 0; i < steps; ++i) {
    const int chunk = pacer.budget(n_decode);
    const double t = cost(n_decode, chunk);
    pacer.record(n_decode, chunk, t);
    if (chunk > 0) seconds = t;
  }
  return seconds;
}

}  // namespace

TEST(PrefillPacer, WithoutStreamsAStepTakesTheWholeChunk) {
  PrefillPacer pacer(256, 2.0);
  EXPECT_EQ(pacer.budget(0), 256);
  // Even after learning that prompt tokens are expensive.
  const Cost expensive = linear(5.0);
  run_decode_steps(pacer, expensive, 8);
  run_mixed_steps(pacer, expensive, 8, 30);
  EXPECT_LT(pacer.budget(8), 256);
  EXPECT_EQ(pacer.budget(0), 256);
}

// A burst: more requests wait for their first token than streams run, and
// their prompts go in whole chunks; as many or fewer, and the streams are
// protected again.
TEST(PrefillPacer, MoreRequestsWaitingThanStreamsAreNotPaced) {
  PrefillPacer pacer(256, 2.0);
  const Cost expensive = linear(5.0);
  run_decode_steps(pacer, expensive, 8);
  run_mixed_steps(pacer, expensive, 8, 30);
  const int paced = pacer.budget(8, 1);
  EXPECT_EQ(paced, pacer.chunk());  // a paced step, not a reference step
  EXPECT_LT(paced, 256);
  EXPECT_EQ(pacer.budget(8, 8), paced);
  EXPECT_EQ(pacer.budget(8, 9), 256);
  EXPECT_EQ(pacer.budget(1, 31), 256);
  EXPECT_EQ(pacer.budget(1, 1), pacer.chunk());
}

TEST(PrefillPacer, SlowdownZeroTurnsPacingOff) {
  PrefillPacer pacer(256, 0.0);
  EXPECT_EQ(pacer.budget(8), 256);
  const Cost expensive = linear(5.0);
  run_decode_steps(pacer, expensive, 8);
  run_mixed_steps(pacer, expensive, 8, 30);
  EXPECT_EQ(pacer.budget(8), 256);
}

TEST(PrefillPacer, StartsCautiousAndWaitsForADecodeOnlyReference) {
  PrefillPacer pacer(256, 2.0);
  EXPECT_EQ(pacer.budget(8), 16);
  // Steps with a prompt chunk alone say nothing about what the streams paid
  // without one (two prompts that arrived together: one decodes while the
  // other is read)...
  const Cost cost = linear();
  for (int i = 0; i < PrefillPacer::kReferenceEvery; ++i) pacer.record(8, 16, cost(8, 16));
  EXPECT_EQ(pacer.chunk(), 16);
  // ...so the next step carries none and measures the reference.
  EXPECT_EQ(pacer.budget(8), 0);
  pacer.record(8, 0, cost(8, 0));
  EXPECT_EQ(pacer.budget(8), 16);
  pacer.record(8, 16, cost(8, 16));
  EXPECT_GT(pacer.budget(8), 16);  // from then on it learns: at 0.1 ms a token, more fits
  // A small cap is the start when it is smaller.
  EXPECT_EQ(PrefillPacer(4, 2.0).budget(8), 4);
}

TEST(PrefillPacer, ConvergesOnALinearCostToAChunkThatFillsTheBudget) {
  // 8 streams: a decode-only step takes 6 ms; slowdown 2 allows 6 ms more,
  // that is 60 prompt tokens at 0.1 ms.
  const Cost cost = linear();
  PrefillPacer pacer(256, 2.0);
  run_decode_steps(pacer, cost, 8);
  const double base = cost(8, 0);
  const double last = run_mixed_steps(pacer, cost, 8, 30);
  // Within the budget, or one token over it: a probe of the size that went
  // over it before.
  EXPECT_LE(last, 2.0 * base + 1.0001e-4);
  EXPECT_GE(last - base, 0.6 * base);  // at least 60% of the allowed extra time is used
  EXPECT_GE(pacer.chunk(), 36);
  EXPECT_LE(pacer.chunk(), 60);
  // Settled: no oscillation over further steps.
  int lo = 256, hi = 0;
  for (int i = 0; i < 20; ++i) {
    run_mixed_steps(pacer, cost, 8, 1);
    lo = std::min(lo, pacer.chunk());
    hi = std::max(hi, pacer.chunk());
  }
  EXPECT_LE(hi - lo, 3);
  EXPECT_GE(lo, 55);
}

TEST(PrefillPacer, AFixedCostPerPromptStepStillConverges) {
  // Any prompt costs 2 ms on top of 0.1 ms a token: 40 tokens fill 6 ms.
  const Cost cost = [](int d, int p) { return (2.0 + 0.5 * d + (p > 0 ? 2.0 : 0.0) + 0.1 * p) * 1e-3; };
  PrefillPacer pacer(256, 2.0);
  run_decode_steps(pacer, cost, 8);
  const double base = cost(8, 0);
  const double last = run_mixed_steps(pacer, cost, 8, 40);
  EXPECT_LE(last, 2.0 * base * (1 + 1e-9));
  EXPECT_GE(last - base, 0.6 * base);
}

TEST(PrefillPacer, MoreStreamsAllowLargerChunksAndBothStayWithinTheBudget) {
  const Cost cost = linear();
  PrefillPacer pacer(1024, 3.0);
  run_decode_steps(pacer, cost, 2);
  run_decode_steps(pacer, cost, 32);
  const double with_2 = run_mixed_steps(pacer, cost, 2, 40);
  const int chunk_2 = pacer.chunk();
  EXPECT_LE(with_2, 3.0 * cost(2, 0) * (1 + 1e-9));
  const double with_32 = run_mixed_steps(pacer, cost, 32, 40);
  EXPECT_LE(with_32, 3.0 * cost(32, 0) * (1 + 1e-9));
  EXPECT_GE(with_32 - cost(32, 0), 0.6 * 2.0 * cost(32, 0));
  EXPECT_GT(pacer.chunk(), 2 * chunk_2);
}

TEST(PrefillPacer, ANeverSeenDecodeCountIsComparedWithTheNearestOne) {
  // Only 8-stream steps were measured; 7 streams read a prompt beside them.
  const Cost cost = linear();
  PrefillPacer pacer(256, 2.0);
  run_decode_steps(pacer, cost, 8);
  const double last = run_mixed_steps(pacer, cost, 7, 30);
  EXPECT_GT(pacer.chunk(), 16);  // it learned, against the 8-stream reference
  EXPECT_LE(last, 2.0 * cost(8, 0) * (1 + 1e-9));
}

TEST(PrefillPacer, ACostCliffLeavesOneTokenPerStep) {
  // Any prompt token makes the step three times as long.
  const Cost cliff = [](int d, int p) { return (2.0 + 0.5 * d) * (p > 0 ? 3.0 : 1.0) * 1e-3; };
  PrefillPacer pacer(256, 2.0);
  run_decode_steps(pacer, cliff, 8);
  run_mixed_steps(pacer, cliff, 8, 30);
  EXPECT_EQ(pacer.chunk(), 1);
}

TEST(PrefillPacer, FreePromptTokensGrowTheChunkToTheCap) {
  // Steps no slower with a prompt (or measured faster: noise) only say that
  // more fits; the chunk at most doubles a step.
  const Cost free_prompt = linear(0.0);
  PrefillPacer pacer(256, 2.0);
  run_decode_steps(pacer, free_prompt, 8);
  run_mixed_steps(pacer, free_prompt, 8, 1);
  EXPECT_EQ(pacer.chunk(), 32);
  run_mixed_steps(pacer, free_prompt, 8, 3);
  EXPECT_EQ(pacer.chunk(), 256);
}

TEST(PrefillPacer, ShortPromptsDoNotGrowTheChunkPastWhatWasMeasured) {
  // Four- and twelve-token prompts cost next to nothing; that says nothing
  // about 200, nor about the 16 the chunk starts at.
  const Cost cost = linear(0.01);
  PrefillPacer pacer(256, 2.0);
  run_decode_steps(pacer, cost, 8);
  for (int i = 0; i < 50; ++i) pacer.record(8, 4, cost(8, 4));
  EXPECT_EQ(pacer.chunk(), 16);
  for (int i = 0; i < 50; ++i) pacer.record(8, 12, cost(8, 12));
  EXPECT_EQ(pacer.chunk(), 16);
  // A full chunk that fits lets it grow, to at most twice what was measured.
  pacer.record(8, 16, cost(8, 16));
  EXPECT_EQ(pacer.chunk(), 32);
}

TEST(PrefillPacer, AMostlyFixedCostDoesNotWearTheChunkDownOverManyPrompts) {
  // A GPU-like step: any prompt adds 6 ms (a second pass over the weights)
  // and 0.25 ms a token beside an 8 ms decode step, so 8 tokens fill a
  // budget of 2. Prompts of 2,000 tokens one after the other, each ending
  // in a short piece: a chunk estimated from short or over-budget steps as
  // if the cost were linear would sink to 1 token and stay there.
  const Cost cost = [](int, int p) { return (8.0 + (p > 0 ? 6.0 + 0.25 * p : 0.0)) * 1e-3; };
  PrefillPacer pacer(256, 2.0);
  run_decode_steps(pacer, cost, 8);
  int steps_of_last_prompt = 0, steps = 0, over = 0;
  for (int prompt = 0; prompt < 10; ++prompt) {
    int left = 2000;
    steps_of_last_prompt = 0;
    while (left > 0) {
      const int n = std::min(pacer.budget(8), left);
      const double t = cost(8, n);
      pacer.record(8, n, t);
      left -= n;
      ++steps_of_last_prompt;
      ++steps;
      if (t > 2.0 * cost(8, 0) * (1 + 1e-9)) ++over;
    }
  }
  // Over the budget: the first steps from the starting 16 and the rare
  // probes of the ceiling.
  EXPECT_LE(over, steps / 50);
  EXPECT_GE(pacer.chunk(), 7);
  EXPECT_LE(steps_of_last_prompt, 2000 / 7 * 9 / 8 + 2);  // about 8 a step, one reference step in 9
}

TEST(PrefillPacer, AModelThatGetsSlowerShrinksTheChunk) {
  PrefillPacer pacer(256, 2.0);
  run_decode_steps(pacer, linear(0.1), 8);
  run_mixed_steps(pacer, linear(0.1), 8, 30);
  const int before = pacer.chunk();
  // Prompt tokens now cost four times as much (a longer context, a busier
  // machine): the chunk that fits is a quarter.
  const Cost slower = linear(0.4);
  const double last = run_mixed_steps(pacer, slower, 8, 15);
  EXPECT_LE(pacer.chunk(), before / 3);
  EXPECT_LE(last, 2.0 * slower(8, 0) * (1 + 1e-9));
  EXPECT_GE(last - slower(8, 0), 0.6 * slower(8, 0));
}

TEST(PrefillPacer, NoisyStepTimesKeepTheAverageStepNearTheBudget) {
  // +-20% noise on every step, decode-only and mixed.
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> noise(0.8, 1.2);
  const Cost exact = linear();
  const Cost noisy = [&](int d, int p) { return exact(d, p) * noise(rng); };
  PrefillPacer pacer(256, 2.0);
  run_decode_steps(pacer, noisy, 8, 20);
  run_mixed_steps(pacer, noisy, 8, 30);
  double sum = 0;
  int max_chunk = 0, steps = 0;
  for (int i = 0; i < 200; ++i) {
    const int chunk = pacer.budget(8);
    pacer.record(8, chunk, noisy(8, chunk));
    if (chunk == 0) continue;  // a reference step
    max_chunk = std::max(max_chunk, chunk);
    sum += exact(8, chunk);
    ++steps;
  }
  const double mean = sum / steps, base = exact(8, 0);
  EXPECT_LE(mean, 2.0 * base * 1.1);
  EXPECT_GE(mean - base, 0.6 * base);
  EXPECT_LE(max_chunk, 60 * 2);  // never more than twice the chunk that fits
}

TEST(PrefillPacer, FollowsStreamsWhoseStepsGrowLongerAsTheirContextsGrow) {
  // Every step adds a position to each stream's context, and attention over
  // it costs 2 us per stream: after 1,000 steps a decode-only step takes
  // 22 ms instead of 6. A reference measured once before the prompt would
  // make every later step look too slow and starve the prompt.
  int positions = 0;
  const Cost growing = [&](int d, int p) { return (2.0 + 0.5 * d + 0.002 * d * positions + 0.1 * p) * 1e-3; };
  PrefillPacer pacer(1024, 2.0);
  run_decode_steps(pacer, growing, 8);
  int reference_steps = 0;
  double last = 0;
  for (int i = 0; i < 1000; ++i, ++positions) {
    const int chunk = pacer.budget(8);
    const double t = growing(8, chunk);
    pacer.record(8, chunk, t);
    if (chunk == 0) ++reference_steps;
    else last = t;
  }
  const double base = growing(8, 0);  // 22 ms now: 220 prompt tokens fit beside it
  EXPECT_LE(last, 2.0 * base * 1.05);
  EXPECT_GE(last - base, 0.6 * base);
  EXPECT_GE(pacer.chunk(), 130);
  // A reference step in every kReferenceEvery + 1: the prompt loses little.
  EXPECT_LE(reference_steps, 1000 / PrefillPacer::kReferenceEvery);
}
