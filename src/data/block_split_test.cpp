// The streaming split against the rule written out over the whole stream.
#include "data/block_split.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

namespace amsp::data {
namespace {

struct Streams {
  std::vector<int32_t> train, valid;
};

// The rule as it reads, on a stream known whole: the reference.
Streams split_whole(const std::vector<int32_t>& all, double f) {
  const int64_t n = static_cast<int64_t>(all.size());
  const int64_t blocks = (n + kSplitBlock - 1) / kSplitBlock;
  std::vector<char> held(blocks, 0);
  int64_t count = 0;
  for (int64_t b = 0; f > 0 && b < blocks; ++b) {
    held[b] = std::floor((b + 1) * f + 1e-9) > std::floor(b * f + 1e-9);
    count += held[b];
  }
  if (f > 0 && count == 0 && blocks >= 2) held[n / kSplitBlock - 1] = 1;  // the last full block
  Streams s;
  for (int64_t i = 0; i < n; ++i) (held[i / kSplitBlock] ? s.valid : s.train).push_back(all[i]);
  return s;
}

Streams split_streaming(const std::vector<int32_t>& all, double f, std::mt19937& rng) {
  Streams s;
  BlockSplitter split(
      f, [&](const int32_t* p, size_t n) { s.train.insert(s.train.end(), p, p + n); },
      [&](const int32_t* p, size_t n) { s.valid.insert(s.valid.end(), p, p + n); });
  for (size_t i = 0; i < all.size();) {  // pushes of random sizes, empty ones included
    const size_t n = std::min(all.size() - i, static_cast<size_t>(rng() % (3 * kSplitBlock)));
    split.push(all.data() + i, n);
    i += n;
  }
  split.finish();
  return s;
}

TEST(BlockSplitter, EqualsTheRuleOnTheWholeStream) {
  std::mt19937 rng(7);
  const int64_t B = kSplitBlock;
  for (double f : {0.0, 0.01, 0.05, 0.1, 0.3, 0.5}) {
    for (int64_t n : {int64_t{0}, int64_t{1}, B - 1, B, B + 1, 2 * B - 1, 2 * B, 2 * B + 5, 3 * B, 7 * B + 3,
                      19 * B, 20 * B, 20 * B + 1, 21 * B - 1, 45 * B + 100}) {
      std::vector<int32_t> all(n);
      std::iota(all.begin(), all.end(), 0);
      const Streams want = split_whole(all, f), got = split_streaming(all, f, rng);
      EXPECT_EQ(got.train, want.train) << "f " << f << " n " << n;
      EXPECT_EQ(got.valid, want.valid) << "f " << f << " n " << n;
    }
  }
}

}  // namespace
}  // namespace amsp::data
