// The next step's windows, read on a thread of their own while the step before
// computes (doc/data.md, "Reading while training"): a window is read from the
// file when it is needed, and on a device the host's time reading it would be
// time the device waits for the step to be issued.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <vector>

#include "engine/sharded_engine.h"

namespace amsp::engine {

class BatchPrefetch {
 public:
  // Fills micro-batch `micro` of `step`: tokens and targets, `tokens` each.
  using Fill = std::function<void(int64_t step, int64_t micro, int32_t* tokens, int32_t* targets)>;
  BatchPrefetch(Fill fill, int64_t micro_batches, int64_t tokens);
  ~BatchPrefetch();  // waits for a read in flight; its error, if any, is dropped
  BatchPrefetch(const BatchPrefetch&) = delete;
  BatchPrefetch& operator=(const BatchPrefetch&) = delete;

  // Starts reading every micro-batch of `step` on another thread.
  void start(int64_t step);
  // Micro-batches of `step`: what start(step) read (waiting for it; its error
  // is thrown here), or read by the caller when no read of `step` was started.
  BatchFn take(int64_t step);

 private:
  Fill fill_;
  int64_t micro_batches_, tokens_;
  int64_t started_ = -1;             // the step being read, -1: none
  std::future<void> reading_;
  std::vector<int32_t> next_, ready_;  // per micro-batch: tokens, then targets
};

}  // namespace amsp::engine
