#include "ckpt/selection.h"

#include <algorithm>

namespace amsp::ckpt {

std::optional<Piece> intersect(const model::TensorSpec& t, int64_t range_begin, int64_t range_end) {
  const int64_t lo = std::max(range_begin, t.offset);
  const int64_t hi = std::min(range_end, t.offset + t.numel);
  if (lo >= hi) return std::nullopt;
  return Piece{lo - t.offset, hi - t.offset, lo - range_begin};
}

std::vector<Slab> row_major_slabs(int64_t begin, int64_t end, int64_t cols) {
  std::vector<Slab> out;
  if (begin >= end || cols <= 0) return out;
  int64_t r0 = begin / cols;
  const int64_t c0 = begin % cols;
  const int64_t r1 = end / cols, c1 = end % cols;  // end is exclusive
  if (r0 == r1) {
    out.push_back({r0, c0, 1, c1 - c0});
    return out;
  }
  if (c0 > 0) {
    out.push_back({r0, c0, 1, cols - c0});
    ++r0;
  }
  if (r1 > r0) out.push_back({r0, 0, r1 - r0, cols});
  if (c1 > 0) out.push_back({r1, 0, 1, c1});
  return out;
}

Piece even_split(int64_t n, int64_t parts, int64_t k) {
  const int64_t b = n * k / parts, e = n * (k + 1) / parts;
  return Piece{b, e, 0};
}

}  // namespace amsp::ckpt
