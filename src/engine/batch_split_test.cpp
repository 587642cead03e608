#include "engine/batch_split.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace amsp::engine {
namespace {

TEST(BatchSplit, SameTokensOnAnyRankCount) {
  // 12 sequences of 32 per step: 4 ranks x 3, 3 x 4, 2 x 6, with micro-batches of at most 2.
  const int64_t tokens = 12 * 32;
  const BatchSplit four = split_global_batch(tokens, 32, 4, 2);
  EXPECT_EQ(four.per_rank, 3);
  EXPECT_EQ(four.micro_batch, 1);  // 2 does not divide 3
  EXPECT_EQ(four.micro_batches, 3);
  const BatchSplit three = split_global_batch(tokens, 32, 3, 2);
  EXPECT_EQ(three.micro_batch, 2);
  EXPECT_EQ(three.micro_batches, 2);
  const BatchSplit two = split_global_batch(tokens, 32, 2, 8);
  EXPECT_EQ(two.micro_batch, 6);
  EXPECT_EQ(two.micro_batches, 1);
  for (const auto& [s, ranks] : {std::pair{four, 4}, {three, 3}, {two, 2}})
    EXPECT_EQ(s.micro_batch * s.micro_batches * ranks * 32, tokens);
  EXPECT_EQ(describe(three, tokens, 32, 3), "384 tokens = 3 ranks x 2 micro-batches x 2 sequences x 32 tokens");
}

TEST(BatchSplit, AnUnevenBatchIsRefusedWithTheNearestThatSplit) {
  try {
    split_global_batch(1000, 32, 4, 8);
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "--global-batch 1000: not a whole number of sequences of 32 tokens on each of 4 ranks; "
                           "the nearest that are: 896 or 1024 tokens");
  }
  EXPECT_THROW(split_global_batch(64, 32, 4, 8), UsageError);  // less than a sequence a rank: 128 is the nearest
}

}  // namespace
}  // namespace amsp::engine
