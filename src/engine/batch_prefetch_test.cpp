#include "engine/batch_prefetch.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>

namespace amsp::engine {
namespace {

// token t of micro-batch m of step s: s * 1000 + m * 100 + t; targets negated.
void fill(int64_t step, int64_t micro, int32_t* tokens, int32_t* targets) {
  for (int t = 0; t < 4; ++t) {
    tokens[t] = static_cast<int32_t>(step * 1000 + micro * 100 + t);
    targets[t] = -tokens[t];
  }
}

void expect_step(const BatchFn& batch, int64_t step) {
  for (int64_t m = 0; m < 3; ++m) {
    int32_t tokens[4], targets[4];
    batch(m, tokens, targets);
    for (int t = 0; t < 4; ++t) {
      ASSERT_EQ(tokens[t], step * 1000 + m * 100 + t) << "step " << step << ", micro " << m;
      ASSERT_EQ(targets[t], -tokens[t]);
    }
  }
}

// Read ahead or not, a step gets its own micro-batches; the read ran on another thread.
TEST(BatchPrefetch, EachStepGetsItsOwnMicroBatches) {
  std::atomic<int> other_thread{0};
  const auto caller = std::this_thread::get_id();
  BatchPrefetch p(
      [&](int64_t s, int64_t m, int32_t* tokens, int32_t* targets) {
        if (std::this_thread::get_id() != caller) ++other_thread;
        fill(s, m, tokens, targets);
      },
      3, 4);
  expect_step(p.take(1), 1);  // nothing started: read by the caller
  EXPECT_EQ(other_thread, 0);
  p.start(2);
  const BatchFn two = p.take(2);
  p.start(3);  // the next read must not overwrite the batch taken
  expect_step(two, 2);
  expect_step(p.take(3), 3);
  EXPECT_EQ(other_thread, 6);
  p.start(5);
  expect_step(p.take(4), 4);  // a step that was not started is read as asked
}

TEST(BatchPrefetch, AReadsErrorReachesTheStepThatTakesIt) {
  BatchPrefetch p([](int64_t s, int64_t, int32_t*, int32_t*) { if (s == 2) throw std::runtime_error("bad id"); },
                  1, 4);
  p.start(2);
  EXPECT_THROW(p.take(2), std::runtime_error);
  p.start(2);  // an error never taken is dropped with the prefetch
}

}  // namespace
}  // namespace amsp::engine
