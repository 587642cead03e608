#include "engine/batch_prefetch.h"

#include <algorithm>

namespace amsp::engine {

BatchPrefetch::BatchPrefetch(Fill fill, int64_t micro_batches, int64_t tokens)
    : fill_(std::move(fill)), micro_batches_(micro_batches), tokens_(tokens) {}

BatchPrefetch::~BatchPrefetch() {
  if (reading_.valid()) reading_.wait();
}

void BatchPrefetch::start(int64_t step) {
  if (reading_.valid()) reading_.wait();
  next_.resize(static_cast<size_t>(micro_batches_ * 2 * tokens_));
  started_ = step;
  reading_ = std::async(std::launch::async, [this, step] {
    for (int64_t m = 0; m < micro_batches_; ++m) {
      int32_t* tokens = next_.data() + m * 2 * tokens_;
      fill_(step, m, tokens, tokens + tokens_);
    }
  });
}

BatchFn BatchPrefetch::take(int64_t step) {
  if (started_ != step || !reading_.valid())
    return [this, step](int64_t micro, int32_t* tokens, int32_t* targets) { fill_(step, micro, tokens, targets); };
  started_ = -1;
  reading_.get();  // rethrows the read's error, e.g. an id outside the vocabulary
  ready_.swap(next_);
  return [this](int64_t micro, int32_t* tokens, int32_t* targets) {
    const int32_t* src = ready_.data() + micro * 2 * tokens_;
    std::copy(src, src + tokens_, tokens);
    std::copy(src + tokens_, src + 2 * tokens_, targets);
  };
}

}  // namespace amsp::engine
