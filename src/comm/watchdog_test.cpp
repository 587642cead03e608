#include "comm/watchdog.h"

#include <gtest/gtest.h>

namespace amsp::comm::watchdog {
namespace {

TEST(Watchdog, RankListsCompressRuns) {
  EXPECT_EQ(rank_list({4, 5, 6, 7}), "4-7");
  EXPECT_EQ(rank_list({0, 4}), "0, 4");
  EXPECT_EQ(rank_list({0, 1, 3, 4, 5, 9}), "0, 1, 3-5, 9");
  EXPECT_EQ(rank_list({7, 5, 6, 6}), "5-7");
  EXPECT_EQ(rank_list({3}), "3");
  EXPECT_EQ(rank_list({}), "");
  EXPECT_EQ(ranks_phrase({3}), "rank 3");
  EXPECT_EQ(ranks_phrase({4, 5}), "ranks 4, 5");
  EXPECT_EQ(ranks_phrase({12, 13, 14}), "ranks 12-14");
}

TEST(Watchdog, EntriesDescribeTheirGroupAndCountOps) {
  Entry e("P", {4, 5, 6, 7});
  EXPECT_EQ(e.description(), "the P group of ranks 4-7");
  EXPECT_EQ(e.issued(), 0u);
  e.set_issued(12);
  EXPECT_EQ(e.issued(), 12u);
  // Another group of the same name, or the same ranks under another name, is another key.
  EXPECT_NE(e.key(), Entry("P", {0, 1, 2, 3}).key());
  EXPECT_NE(e.key(), Entry("G", {4, 5, 6, 7}).key());
  EXPECT_EQ(e.key(), Entry("P", {4, 5, 6, 7}).key());
}

TEST(Watchdog, OpsAreNumberedWithinAStep) {
  set_step(0);
  EXPECT_EQ(next_op_index(), -1);
  set_step(3);
  EXPECT_EQ(next_op_index(), 0);
  EXPECT_EQ(next_op_index(), 1);
  set_step(4);
  EXPECT_EQ(next_op_index(), 0);
  set_step(0);
}

}  // namespace
}  // namespace amsp::comm::watchdog
