#include "data/block_split.h"

#include <algorithm>
#include <cmath>

namespace amsp::data {

BlockSplitter::BlockSplitter(double f, Sink train, Sink valid)
    : f_(f), train_(std::move(train)), valid_(std::move(valid)) {
  current_.reserve(kSplitBlock);
}

bool BlockSplitter::rule_holds_out(int64_t b) const {
  if (f_ <= 0) return false;
  const double lo = std::floor(static_cast<double>(b) * f_ + 1e-9);
  const double hi = std::floor(static_cast<double>(b + 1) * f_ + 1e-9);
  return hi > lo;
}

void BlockSplitter::push(const int32_t* ids, size_t n) {
  while (n > 0) {
    const size_t take = std::min(n, static_cast<size_t>(kSplitBlock) - current_.size());
    current_.insert(current_.end(), ids, ids + take);
    ids += take;
    n -= take;
    if (current_.size() == static_cast<size_t>(kSplitBlock)) complete_block();
  }
}

void BlockSplitter::complete_block() {
  if (rule_holds_out(block_)) {
    ++held_out_;
    if (!kept_.empty()) train_(kept_.data(), kept_.size()), kept_.clear();
    valid_(current_.data(), current_.size());
  } else if (f_ > 0 && held_out_ == 0) {
    if (!kept_.empty()) train_(kept_.data(), kept_.size());
    kept_.swap(current_);
  } else {
    train_(current_.data(), current_.size());
  }
  current_.clear();
  ++block_;
}

void BlockSplitter::finish() {
  const bool partial = !current_.empty();
  const bool partial_held_out = partial && rule_holds_out(block_);
  if (partial_held_out) ++held_out_;
  const int64_t blocks = block_ + (partial ? 1 : 0);
  if (!kept_.empty()) {
    (held_out_ == 0 && blocks >= 2 ? valid_ : train_)(kept_.data(), kept_.size());
    kept_.clear();
  }
  if (partial) (partial_held_out ? valid_ : train_)(current_.data(), current_.size());
  current_.clear();
}

}  // namespace amsp::data
