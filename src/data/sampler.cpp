// Training and evaluation windows over a TokenDataset.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/rng.h"
#include "data/dataset.h"

namespace amsp::data {

namespace {

// RNG stream of training-window starts ("trainwin"); no other user of
// core/rng.h may use it.
constexpr uint64_t kTrainWindowStream = 0x747261696e77696eULL;

// Tokens [start, start + T] of a split: the inputs and, shifted by one, the targets.
void read_window(const TokenDataset& data, Split split, int64_t start, int64_t T, int32_t* tokens,
                 int32_t* targets) {
  data.read(split, start, T, tokens);
  data.read(split, start + T, 1, targets + T - 1);
  std::memcpy(targets, tokens + 1, sizeof(int32_t) * (T - 1));
}

}  // namespace

uint64_t step_row_index(int64_t step, int64_t row) {
  constexpr int64_t kLimit = int64_t{1} << 32;
  if (step < 0 || step >= kLimit) fail("sampling: step ", step, " outside [0, 2^32)");
  if (row < 0 || row >= kLimit) fail("sampling: row ", row, " outside [0, 2^32)");
  return (static_cast<uint64_t>(step) << 32) | static_cast<uint64_t>(row);
}

int64_t train_window_start(const TokenDataset& data, uint64_t seed, int64_t step, int64_t row, int64_t T) {
  if (T <= 0) fail("train_window_start: T = ", T, ": expected T > 0");
  const int64_t n = data.size(Split::kTrain);
  if (n < T + 1)
    fail_usage("--data ", data.path(), ": train split has ", n, " tokens, fewer than one sequence of --seq-len ",
               T, " + 1");
  // Starts uniform over [0, n - (T+1)]: n - T choices.
  const uint64_t choices = static_cast<uint64_t>(n - T);
  return static_cast<int64_t>(random_below(seed, kTrainWindowStream, step_row_index(step, row), choices));
}

void sample_train_batch(const TokenDataset& data, uint64_t seed, int64_t step, int64_t first_row,
                        int64_t B, int64_t T, int32_t* tokens, int32_t* targets) {
  if (T <= 0 || B < 0) fail("sample_train_batch: B = ", B, ", T = ", T, ": expected B >= 0, T > 0");
  for (int64_t b = 0; b < B; ++b) {
    const int64_t start = train_window_start(data, seed, step, first_row + b, T);
    read_window(data, Split::kTrain, start, T, tokens + b * T, targets + b * T);
  }
}

int64_t num_eval_windows(const TokenDataset& data, int64_t T, Split split) {
  if (T <= 0) fail("num_eval_windows: T = ", T, ": expected T > 0");
  const int64_t n = data.size(split);
  // Window i covers [i T, i T + T]; it fits when i T + T + 1 <= n.
  return n < T + 1 ? 0 : (n - 1) / T;
}

void eval_batch(const TokenDataset& data, int64_t first_window, int64_t B, int64_t T, int32_t* tokens,
                int32_t* targets, Split split) {
  if (T <= 0 || B < 0) fail("eval_batch: B = ", B, ", T = ", T, ": expected B >= 0, T > 0");
  const int64_t windows = num_eval_windows(data, T, split);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t w = first_window + b;
    if (w >= 0 && w < windows) {
      read_window(data, split, w * T, T, tokens + b * T, targets + b * T);
    } else {
      // Padding rows: targets -1 are ignored by the loss.
      std::fill(tokens + b * T, tokens + (b + 1) * T, 0);
      std::fill(targets + b * T, targets + (b + 1) * T, -1);
    }
  }
}

}  // namespace amsp::data
