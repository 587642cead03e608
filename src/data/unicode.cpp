#include "data/unicode.h"

#include <algorithm>
#include <array>
#include <vector>

namespace amsp::data {
namespace {

struct Range {
  char32_t first, last;
  CharClass cls;
};

constexpr Range kRanges[] = {
#include "data/unicode_ranges.inc"
};

CharClass search(char32_t cp) {
  const Range* end = std::end(kRanges);
  const Range* r = std::upper_bound(std::begin(kRanges), end, cp,
                                    [](char32_t c, const Range& x) { return c < x.first; });
  if (r == std::begin(kRanges)) return CharClass::kOther;
  --r;
  return cp <= r->last ? r->cls : CharClass::kOther;
}

// The Basic Multilingual Plane, where nearly all text lives, as one table.
const std::vector<CharClass>& bmp() {
  static const std::vector<CharClass> table = [] {
    std::vector<CharClass> t(0x10000, CharClass::kOther);
    for (const Range& r : kRanges)
      for (char32_t c = r.first; c <= r.last && c < 0x10000; ++c) t[c] = r.cls;
    return t;
  }();
  return table;
}

}  // namespace

CharClass char_class(char32_t cp) {
  if (cp < 0x10000) return bmp()[cp];
  return search(cp);
}

}  // namespace amsp::data
