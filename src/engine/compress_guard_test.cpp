#include "engine/compress_guard.h"

#include <gtest/gtest.h>

#include <cmath>

namespace amsp::engine {
namespace {

plan::Compression both_int8() { return plan::parse_compression("p=int8,g=int8"); }

TEST(CompressGuard, DueAtStepOneAndEveryNAfterWhileCompressing) {
  CompressionGuard g;
  g.every = 100;
  EXPECT_TRUE(guard_due(g, both_int8(), 1));
  EXPECT_FALSE(guard_due(g, both_int8(), 100));
  EXPECT_TRUE(guard_due(g, both_int8(), 101));
  EXPECT_FALSE(guard_due(g, plan::Compression{}, 1));  // nothing compressed
  g.mode = CompressionGuard::kOff;
  EXPECT_FALSE(guard_due(g, both_int8(), 1));
}

TEST(CompressGuard, BelowTheThresholdNothingHappens) {
  const GuardVerdict v = judge_guard(CompressionGuard{}, {0.02, 0.01}, both_int8(), 1);
  EXPECT_TRUE(v.warnings.empty());
  EXPECT_FALSE(v.next);
}

TEST(CompressGuard, WarnNamesTheKindAndTheErrorAndChangesNothing) {
  const GuardVerdict v = judge_guard(CompressionGuard{}, {0.02, 0.25}, both_int8(), 101);
  ASSERT_EQ(v.warnings.size(), 1u);
  EXPECT_EQ(v.warnings[0],
            "compress guard: step 101: the gradients' reductions as int8 move one micro-batch's gradient by "
            "25.00% (|compressed - exact| / |exact|; threshold 5.00%); --compress-guard fallback would stop "
            "compressing them");
  EXPECT_FALSE(v.next);
}

TEST(CompressGuard, FallbackTurnsOffOnlyTheOffendingKind) {
  CompressionGuard g;
  g.mode = CompressionGuard::kFallback;
  const GuardVerdict v = judge_guard(g, {0.5, 0.01}, both_int8(), 1);
  ASSERT_TRUE(v.next);
  EXPECT_EQ(v.next->p_bits, 0);
  EXPECT_EQ(v.next->g_bits, 8);
  EXPECT_NE(v.warnings.at(0).find("they go uncompressed from step 1 on"), std::string::npos);
}

TEST(CompressGuard, ANanReadingCountsAsOverTheThreshold) {
  CompressionGuard g;
  g.mode = CompressionGuard::kFallback;
  const GuardVerdict v = judge_guard(g, {std::nan(""), std::nullopt}, both_int8(), 1);
  ASSERT_TRUE(v.next);
  EXPECT_EQ(v.next->p_bits, 0);
}

TEST(CompressGuard, AResumeKeepsTheSwitchOnlyForTheSameRequest) {
  const std::string options = R"({"compress": "p=int8,g=int8,block=256", "compress_active": "p=off,g=int8,block=256"})";
  const auto kept = resumed_compression(options, both_int8());
  ASSERT_TRUE(kept);
  EXPECT_EQ(kept->p_bits, 0);
  EXPECT_EQ(kept->g_bits, 8);
  EXPECT_FALSE(resumed_compression(options, plan::parse_compression("p=int4")));  // the user asks anew
  EXPECT_FALSE(resumed_compression(R"({"compress": "p=int8,g=int8,block=256"})", both_int8()));  // no switch
  EXPECT_FALSE(resumed_compression(R"({"seed": 1})", both_int8()));  // written before the guard existed
}

}  // namespace
}  // namespace amsp::engine
