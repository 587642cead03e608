#include "data/hf_pretokenize.h"

#include "data/unicode.h"

namespace amsp::data {
namespace {

const std::string kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const std::string kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const std::string kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct Char {
  char32_t cp;
  CharClass cls;
  size_t offset;  // of its first byte in the text
};

// The text as characters, with a sentinel past the end (offset = size, class
// kOther, code point 0) so that look-aheads need no bounds checks.
void decode(std::string_view s, std::vector<Char>* chars) {
  chars->clear();
  for (size_t i = 0; i < s.size();) {
    size_t len = 1;
    const char32_t cp = decode_utf8(s.data() + i, s.size() - i, &len);
    chars->push_back({cp, char_class(cp), i});
    i += len;
  }
  chars->push_back({0, CharClass::kOther, s.size()});
}

class Matcher {
 public:
  Matcher(SplitPattern p, const std::vector<Char>& c) : p_(p), c_(c), n_(c.size() - 1) {}

  // The length in characters of the match at i (>= 1).
  size_t match(size_t i) const {
    if (size_t k = contraction(i)) return k;
    if (p_ == SplitPattern::kGpt2) {
      for (CharClass cls : {CharClass::kLetter, CharClass::kNumber, CharClass::kOther})
        if (size_t k = space_then_run(i, cls)) return k;
    } else {
      if (size_t k = letters_after_one(i)) return k;
      if (size_t k = digits(i, p_ == SplitPattern::kLlama3 ? 3 : 1)) return k;
      if (size_t k = space_then_run(i, CharClass::kOther)) return k + newlines(i + k);
      if (size_t k = spaces_to_last_newline(i)) return k;
    }
    if (size_t k = spaces_not_before_text(i)) return k;
    if (size_t k = run(i, CharClass::kSpace)) return k;
    return 1;  // not reached: every character is a letter, number, space or other
  }

 private:
  bool is(size_t i, CharClass cls) const { return i < n_ && c_[i].cls == cls; }
  bool newline(size_t i) const { return i < n_ && (c_[i].cp == '\r' || c_[i].cp == '\n'); }
  size_t run(size_t i, CharClass cls) const {
    size_t j = i;
    while (is(j, cls)) ++j;
    return j - i;
  }
  size_t newlines(size_t i) const {
    size_t j = i;
    while (newline(j)) ++j;
    return j - i;
  }
  // Case-sensitive for GPT-2; LLaMA-3 and Qwen2 have (?i:...), under which
  // Unicode case folding also takes U+017F (long s) for s.
  bool letter_is(size_t i, char lower) const {
    if (i >= n_) return false;
    const char32_t cp = c_[i].cp;
    if (cp == static_cast<char32_t>(lower)) return true;
    if (p_ == SplitPattern::kGpt2) return false;
    return cp == static_cast<char32_t>(lower - 'a' + 'A') || (lower == 's' && cp == 0x17F);
  }
  // 's|'t|'re|'ve|'m|'ll|'d
  size_t contraction(size_t i) const {
    if (c_[i].cp != '\'') return 0;
    for (char one : {'s', 't'})
      if (letter_is(i + 1, one)) return 2;
    if (letter_is(i + 1, 'r') && letter_is(i + 2, 'e')) return 3;
    if (letter_is(i + 1, 'v') && letter_is(i + 2, 'e')) return 3;
    if (letter_is(i + 1, 'm')) return 2;
    if (letter_is(i + 1, 'l') && letter_is(i + 2, 'l')) return 3;
    if (letter_is(i + 1, 'd')) return 2;
    return 0;
  }
  // " ?X+" for X = \p{L}, \p{N} or [^\s\p{L}\p{N}]
  size_t space_then_run(size_t i, CharClass cls) const {
    if (c_[i].cp == ' ' && is(i + 1, cls)) return 1 + run(i + 1, cls);
    return run(i, cls);
  }
  // "[^\r\n\p{L}\p{N}]?\p{L}+"
  size_t letters_after_one(size_t i) const {
    const bool lead = i < n_ && !newline(i) && (c_[i].cls == CharClass::kOther || c_[i].cls == CharClass::kSpace);
    if (lead && is(i + 1, CharClass::kLetter)) return 1 + run(i + 1, CharClass::kLetter);
    return run(i, CharClass::kLetter);
  }
  // "\p{N}{1,max}"
  size_t digits(size_t i, size_t max) const {
    size_t k = 0;
    while (k < max && is(i + k, CharClass::kNumber)) ++k;
    return k;
  }
  // "\s*[\r\n]+": the greedy \s* backs off to the run's last CR or LF.
  size_t spaces_to_last_newline(size_t i) const {
    const size_t len = run(i, CharClass::kSpace);
    for (size_t k = len; k > 0; --k)
      if (newline(i + k - 1)) return k;
    return 0;
  }
  // "\s+(?!\S)": the whole run at the end of the text, else all of it but the
  // last space (which then goes with the text after it).
  size_t spaces_not_before_text(size_t i) const {
    const size_t len = run(i, CharClass::kSpace);
    if (len == 0) return 0;
    if (i + len == n_) return len;
    return len - 1;
  }

  SplitPattern p_;
  const std::vector<Char>& c_;
  size_t n_;
};

}  // namespace

std::optional<SplitPattern> known_split_pattern(const std::string& regex) {
  if (regex == kGpt2) return SplitPattern::kGpt2;
  if (regex == kLlama3) return SplitPattern::kLlama3;
  if (regex == kQwen2) return SplitPattern::kQwen2;
  return std::nullopt;
}

const std::array<std::string, 256>& byte_level_chars() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> out;
    int extra = 0;  // bytes that are not printable map to U+0100 onwards, in order
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
      if (cp < 0x80) {
        out[b] = std::string(1, static_cast<char>(cp));
      } else {
        out[b] = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
      }
    }
    return out;
  }();
  return table;
}

void split_by_pattern(SplitPattern pattern, std::string_view s, std::vector<std::string_view>* out) {
  thread_local std::vector<Char> chars;
  decode(s, &chars);
  const Matcher m(pattern, chars);
  const size_t n = chars.size() - 1;
  for (size_t i = 0; i < n;) {
    const size_t k = m.match(i);
    out->push_back(s.substr(chars[i].offset, chars[i + k].offset - chars[i].offset));
    i += k;
  }
}

}  // namespace amsp::data
