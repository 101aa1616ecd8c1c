// choose_context_size: the trained context by default, capped by what the
// memory budget holds, in whole granules; an explicit request as asked.
#include <gtest/gtest.h>

#include "common/error.h"
#include "engine/context_size.h"

using m40::engine::choose_context_size;
using m40::engine::kContextGranule;
using m40::engine::MemoryBudget;

TEST(ContextSize, TheTrainedContextWhenItFits) {
  const MemoryBudget roomy{64ull << 30, 4ull << 30, 128 << 10};  // 60 GiB of room at 128 KiB a position
  EXPECT_EQ(choose_context_size(131072, 0, roomy), 131072);
  EXPECT_EQ(choose_context_size(8192, 0, roomy), 8192);
}

TEST(ContextSize, CappedByTheMemoryInWholeGranules) {
  // 24 GiB card, 4.5 GiB of weights and scratch, Llama-3-8B's 128 KiB per position:
  // 19.5 GiB / 128 KiB = 159744 positions, more than trained; at 160 KiB per position
  // (two sequences of 80 KiB) 127795 -> 127744.
  const MemoryBudget card{24ull << 30, 4608ull << 20, 160 << 10};
  const int n = choose_context_size(131072, 0, card);
  EXPECT_EQ(n % kContextGranule, 0);
  EXPECT_EQ(n, 127744);
  EXPECT_LE(card.fixed + static_cast<uint64_t>(n) * card.per_position, card.available);
  EXPECT_GT(card.fixed + static_cast<uint64_t>(n + kContextGranule) * card.per_position, card.available);
}

TEST(ContextSize, AtLeastOneGranuleEvenWhenNothingFits) {
  const MemoryBudget full{1ull << 30, 2ull << 30, 1024};
  EXPECT_EQ(choose_context_size(32768, 0, full), kContextGranule);
  EXPECT_EQ(choose_context_size(100, 0, full), 100);  // never above the trained context
}

TEST(ContextSize, AnExplicitRequestIsKeptAndANegativeOneRefused) {
  const MemoryBudget small{1ull << 30, 0, 1 << 20};  // room for 1024 positions
  EXPECT_EQ(choose_context_size(4096, 0, small), 1024);
  EXPECT_EQ(choose_context_size(4096, 8192, small), 8192);  // the memory plan says whether it fits
  EXPECT_THROW(choose_context_size(4096, -1, small), m40::Error);
}

TEST(ContextSize, WithoutAContextLengthTheDefaultIs4096) {
  EXPECT_EQ(choose_context_size(0, 0, MemoryBudget{}), 4096);
}
