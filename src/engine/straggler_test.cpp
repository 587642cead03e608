#include "engine/straggler.h"

#include <gtest/gtest.h>

namespace amsp::engine {
namespace {

// Feeds windows of busy times through judge_window as StragglerWatch does and
// returns the straggler named after each.
std::vector<int> verdicts(const std::vector<std::vector<double>>& windows, StragglerOptions o = {}) {
  int candidate = -1;
  int64_t run = 0;
  std::vector<int> out;
  for (const auto& w : windows) out.push_back(judge_window(w, o, &candidate, &run).straggler);
  return out;
}

TEST(Straggler, EqualRanksNameNobody) {
  EXPECT_EQ(verdicts({{10, 10, 10, 10}, {10, 10, 10, 10}, {10, 10, 10, 10}}), (std::vector<int>{-1, -1, -1}));
}

TEST(Straggler, NamedAfterThreeWindowsInARow) {
  const std::vector<double> slow2 = {10, 10.2, 12.1, 9.9};
  EXPECT_EQ(verdicts({slow2, slow2, slow2, slow2}), (std::vector<int>{-1, -1, 2, 2}));
}

TEST(Straggler, MedianAndExcess) {
  int candidate = -1;
  int64_t run = 0;
  const BusySpread s = judge_window({8, 10, 13, 9}, StragglerOptions{}, &candidate, &run);
  EXPECT_DOUBLE_EQ(s.median_ms, 9.5);
  EXPECT_EQ(s.slowest, 2);
  EXPECT_NEAR(s.excess, 13 / 9.5 - 1, 1e-12);
  EXPECT_EQ(candidate, 2);
  EXPECT_EQ(run, 1);
}

TEST(Straggler, AWindowWithinTheThresholdStartsOver) {
  const std::vector<double> slow = {10, 12, 10, 10}, fine = {10, 10.5, 10, 10};
  EXPECT_EQ(verdicts({slow, slow, fine, slow, slow, slow}), (std::vector<int>{-1, -1, -1, -1, -1, 1}));
}

TEST(Straggler, ADifferentSlowestRankEachWindowIsNoise) {
  EXPECT_EQ(verdicts({{12, 10, 10, 10}, {10, 12, 10, 10}, {10, 10, 12, 10}, {10, 10, 10, 12}}),
            (std::vector<int>{-1, -1, -1, -1}));
}

TEST(Straggler, ThresholdAndWindowsAreTheOptions) {
  const std::vector<double> w = {10, 10, 10, 11.5};  // 15% over the median
  EXPECT_EQ(verdicts({w, w}, {50, 0.10, 2}), (std::vector<int>{-1, 3}));
  EXPECT_EQ(verdicts({w, w, w}, {50, 0.20, 1}), (std::vector<int>{-1, -1, -1}));
}

TEST(Straggler, OneRankHasNoneToCompareWith) {
  EXPECT_EQ(verdicts({{10}, {20}, {30}, {40}}), (std::vector<int>{-1, -1, -1, -1}));
}

}  // namespace
}  // namespace amsp::engine
