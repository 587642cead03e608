// The held-out split of a token stream, decided as the stream goes by.
//
// The stream is cut into blocks of kSplitBlock tokens; block b is held out
// when floor((b+1) f) > floor(b f), so held-out blocks are spread evenly
// (every 1/f-th block) and make up a share f. A stream of two blocks or more
// holds out at least one: if the rule picks none, the last full block. That
// block is known only at the end, so the splitter keeps the latest full block
// back while nothing is held out yet: it holds at most two blocks, whatever
// the stream's length.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace amsp::data {

inline constexpr int64_t kSplitBlock = 2048;

class BlockSplitter {
 public:
  using Sink = std::function<void(const int32_t* ids, size_t n)>;
  // f in [0, 0.5]; train and valid receive their tokens in stream order.
  BlockSplitter(double f, Sink train, Sink valid);

  void push(const int32_t* ids, size_t n);
  // Sends what is left; call once, after the last push.
  void finish();

 private:
  bool rule_holds_out(int64_t block) const;
  void complete_block();

  double f_;
  Sink train_, valid_;
  std::vector<int32_t> current_;  // block block_, being filled
  int64_t block_ = 0;
  std::vector<int32_t> kept_;     // the latest full block, while none is held out
  int64_t held_out_ = 0;
};

}  // namespace amsp::data
