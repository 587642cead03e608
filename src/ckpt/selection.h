// Pure index arithmetic between a rank's shard of a unit and the datasets of
// a checkpoint. A shard is a range of the unit's padded flat buffer; it meets
// each tensor in one contiguous run of the tensor's row-major elements, and a
// run of a [rows, cols] matrix is at most three rectangles: the tail of its
// first row, whole middle rows, the head of its last row.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "model/layout.h"

namespace amsp::ckpt {

// A run of a tensor's row-major elements [begin, end), and where it sits in
// the shard's buffer (elements from the shard's first).
struct Piece {
  int64_t begin = 0, end = 0;
  int64_t buffer_offset = 0;
  int64_t size() const { return end - begin; }
};

// The part of tensor t inside the unit range [range_begin, range_end) (padded
// unit coordinates), or nullopt if they do not meet.
std::optional<Piece> intersect(const model::TensorSpec& t, int64_t range_begin, int64_t range_end);

// A rectangle of a row-major [rows, cols] matrix.
struct Slab {
  int64_t row = 0, col = 0, rows = 0, cols = 0;
  bool operator==(const Slab&) const = default;
};

// Elements [begin, end) of a matrix with `cols` columns, as at most three
// rectangles in row-major order (so a contiguous memory buffer matches the
// union selected with H5S_SELECT_OR). Empty if begin >= end.
std::vector<Slab> row_major_slabs(int64_t begin, int64_t end, int64_t cols);

// Splits [0, n) into `parts` near-equal consecutive ranges; range k.
Piece even_split(int64_t n, int64_t parts, int64_t k);

}  // namespace amsp::ckpt
