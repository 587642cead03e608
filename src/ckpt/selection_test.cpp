#include "ckpt/selection.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/checksum.h"

namespace amsp::ckpt {
namespace {

// Every run of a 5 x 7 matrix: the slabs cover exactly its elements, in
// row-major order, with at most three slabs.
TEST(CkptSelection, SlabsCoverEveryRunInOrder) {
  const int64_t rows = 5, cols = 7;
  for (int64_t b = 0; b <= rows * cols; ++b)
    for (int64_t e = b; e <= rows * cols; ++e) {
      const auto slabs = row_major_slabs(b, e, cols);
      EXPECT_LE(slabs.size(), 3u);
      std::vector<int64_t> got;
      for (const Slab& s : slabs) {
        EXPECT_GT(s.rows, 0);
        EXPECT_GT(s.cols, 0);
        EXPECT_LE(s.col + s.cols, cols);
        for (int64_t r = s.row; r < s.row + s.rows; ++r)
          for (int64_t c = s.col; c < s.col + s.cols; ++c) got.push_back(r * cols + c);
      }
      std::vector<int64_t> want;
      for (int64_t i = b; i < e; ++i) want.push_back(i);
      ASSERT_EQ(got, want) << "run [" << b << ", " << e << ")";
    }
}

TEST(CkptSelection, ThreeSlabs) {
  EXPECT_EQ(row_major_slabs(3, 26, 7),
            (std::vector<Slab>{{0, 3, 1, 4}, {1, 0, 2, 7}, {3, 0, 1, 5}}));
  EXPECT_EQ(row_major_slabs(7, 21, 7), (std::vector<Slab>{{1, 0, 2, 7}}));
  EXPECT_TRUE(row_major_slabs(4, 4, 7).empty());
}

TEST(CkptSelection, IntersectTensorWithShard) {
  model::TensorSpec t;
  t.offset = 100;
  t.numel = 50;
  EXPECT_FALSE(intersect(t, 0, 100));
  EXPECT_FALSE(intersect(t, 150, 200));
  const auto a = intersect(t, 80, 120);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->begin, 0);
  EXPECT_EQ(a->end, 20);
  EXPECT_EQ(a->buffer_offset, 20);
  const auto b = intersect(t, 120, 400);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->begin, 20);
  EXPECT_EQ(b->end, 50);
  EXPECT_EQ(b->buffer_offset, 0);
}

TEST(CkptSelection, EvenSplitTiles) {
  int64_t next = 0;
  for (int64_t k = 0; k < 3; ++k) {
    const Piece p = even_split(10, 3, k);
    EXPECT_EQ(p.begin, next);
    next = p.end;
  }
  EXPECT_EQ(next, 10);
}

TEST(CkptChecksum, PartsSumToWhole) {
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(random_normal(3, 0, i));
  const uint64_t whole = checksum(x.data(), 1000, 0);
  for (int64_t cut : {0, 1, 333, 999, 1000})
    EXPECT_EQ(checksum(x.data(), cut, 0) + checksum(x.data() + cut, 1000 - cut, cut), whole);
}

TEST(CkptChecksum, OrderAndBitSensitive) {
  std::vector<float> x = {1.0f, 2.0f, 3.0f, 4.0f};
  const uint64_t base = checksum(x.data(), 4, 0);
  std::swap(x[1], x[2]);
  EXPECT_NE(checksum(x.data(), 4, 0), base);
  std::swap(x[1], x[2]);
  x[3] = std::nextafter(x[3], 10.0f);  // one bit
  EXPECT_NE(checksum(x.data(), 4, 0), base);
  x[3] = 4.0f;
  EXPECT_NE(checksum(x.data(), 4, 1), base);  // same values, shifted indices
  EXPECT_EQ(checksum(x.data(), 4, 0), base);
}

TEST(CkptNames, HuggingFaceRoundTrip) {
  for (const char* n : {"model.embed_tokens.weight", "model.layers.3.self_attn.q_proj.weight",
                        "model.norm.weight", "lm_head.weight"})
    EXPECT_EQ(hf_name(dataset_name(n)), n);
  EXPECT_EQ(dataset_name("model.norm.weight"), "norm.weight");
  EXPECT_EQ(dataset_name("lm_head.weight"), "lm_head.weight");
}

}  // namespace
}  // namespace amsp::ckpt
