#include "data/unicode.h"

#include <algorithm>
#include <array>
#include <unordered_map>
#include <vector>

#include "data/nfc_tables.inc"

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

// ---------------------------------------------------------------- NFC

struct Span {
  char32_t first, last;
};
struct Ccc {
  char32_t cp;
  uint8_t ccc;
};
struct Decomposition {
  char32_t cp;
  char32_t to[4];  // 0-terminated when shorter
};
struct Composition {
  char32_t first, second, composite;
};

constexpr Span kUnstable[] = {AMSP_NFC_UNSTABLE};
constexpr Ccc kCcc[] = {AMSP_NFC_CCC};
constexpr Decomposition kDecompositions[] = {AMSP_NFC_DECOMPOSITIONS};
constexpr Composition kCompositions[] = {AMSP_NFC_COMPOSITIONS};

// Hangul syllables decompose and compose by arithmetic (Unicode 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

struct NfcData {
  std::vector<bool> unstable_bmp = std::vector<bool>(0x10000, false);
  std::unordered_map<char32_t, uint8_t> ccc;
  std::unordered_map<char32_t, const Decomposition*> decompositions;
  std::unordered_map<uint64_t, char32_t> compositions;
  NfcData() {
    for (const Span& s : kUnstable)
      for (char32_t c = s.first; c <= s.last && c < 0x10000; ++c) unstable_bmp[c] = true;
    for (const Ccc& c : kCcc) ccc[c.cp] = c.ccc;
    for (const Decomposition& d : kDecompositions) decompositions[d.cp] = &d;
    for (const Composition& c : kCompositions) compositions[key(c.first, c.second)] = c.composite;
  }
  static uint64_t key(char32_t a, char32_t b) { return (static_cast<uint64_t>(a) << 21) | b; }
  bool unstable(char32_t cp) const {
    if (cp < 0x10000) return unstable_bmp[cp];
    const Span* end = std::end(kUnstable);
    const Span* s = std::upper_bound(std::begin(kUnstable), end, cp,
                                     [](char32_t c, const Span& x) { return c < x.first; });
    return s != std::begin(kUnstable) && cp <= (s - 1)->last;
  }
  int class_of(char32_t cp) const {
    const auto it = ccc.find(cp);
    return it == ccc.end() ? 0 : it->second;
  }
  void decompose(char32_t cp, std::vector<char32_t>* out) const {
    if (cp >= kSBase && cp < kSBase + kSCount) {
      const char32_t s = cp - kSBase;
      out->push_back(kLBase + s / kNCount);
      out->push_back(kVBase + (s % kNCount) / kTCount);
      if (s % kTCount) out->push_back(kTBase + s % kTCount);
      return;
    }
    const auto it = decompositions.find(cp);
    if (it == decompositions.end()) return out->push_back(cp);
    for (char32_t c : it->second->to)
      if (c) out->push_back(c);
  }
  // The primary composite of a + b, or 0.
  char32_t compose(char32_t a, char32_t b) const {
    if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
      return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
    if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
      return a + (b - kTBase);
    const auto it = compositions.find(key(a, b));
    return it == compositions.end() ? 0 : it->second;
  }
};

const NfcData& nfc_data() {
  static const NfcData data;
  return data;
}

void append_utf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace

std::string nfc(std::string_view s) {
  // Below U+0300 (lead bytes below 0xCC) nothing changes under NFC.
  if (std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0xCC; }))
    return std::string(s);
  const NfcData& t = nfc_data();
  std::vector<char32_t> cps;
  bool stable = true;
  for (size_t i = 0; i < s.size();) {
    size_t len = 1;
    cps.push_back(decode_utf8(s.data() + i, s.size() - i, &len));
    stable = stable && !t.unstable(cps.back());
    i += len;
  }
  if (stable) return std::string(s);
  // Decompose, then put each run of combining marks in canonical order (stable by class).
  std::vector<char32_t> d;
  for (char32_t cp : cps) t.decompose(cp, &d);
  for (size_t i = 1; i < d.size(); ++i) {
    const int k = t.class_of(d[i]);
    if (k == 0) continue;
    for (size_t j = i; j > 0 && t.class_of(d[j - 1]) > k; --j) std::swap(d[j], d[j - 1]);
  }
  // Compose (the algorithm of Unicode's normalization sample code): a character
  // joins the last starter unless a character of the same or a higher class, or
  // a starter, stands between them.
  size_t starter = 0, kept = 1;
  int last_class = d.empty() ? 0 : (t.class_of(d[0]) == 0 ? 0 : 256);
  for (size_t i = 1; i < d.size(); ++i) {
    const char32_t ch = d[i];
    const int k = t.class_of(ch);
    const char32_t composite = t.compose(d[starter], ch);
    if (composite && (last_class < k || last_class == 0)) {
      d[starter] = composite;
      continue;
    }
    if (k == 0) starter = kept;
    last_class = k;
    d[kept++] = ch;
  }
  d.resize(std::min(kept, d.size()));
  std::string out;
  out.reserve(s.size());
  for (char32_t cp : d) append_utf8(cp, &out);
  return out;
}

CharClass char_class(char32_t cp) {
  if (cp < 0x10000) return bmp()[cp];
  return search(cp);
}

}  // namespace amsp::data
