// The little of Unicode that tokenizers need: UTF-8 decoding, the classes that
// pre-tokenizer patterns test (\p{L}, \p{N}, \s) and NFC, each from the Unicode
// version Hugging Face tokenizers has it in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace amsp::data {

enum class CharClass : uint8_t { kOther, kLetter, kNumber, kSpace };

// kLetter: general category L*; kNumber: N*; kSpace: the White_Space property.
CharClass char_class(char32_t cp);

// Decodes the UTF-8 character at s[0..n) (n >= 1) and sets *len to its length.
// Text is checked as UTF-8 before it gets here; a malformed byte decodes as
// U+FFFD of length 1 rather than reading past the end.
inline char32_t decode_utf8(const char* s, size_t n, size_t* len) {
  const auto b0 = static_cast<unsigned char>(s[0]);
  if (b0 < 0x80) return *len = 1, b0;
  const size_t want = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : b0 >= 0xC0 ? 2 : 0;
  if (want == 0 || want > n) return *len = 1, 0xFFFD;
  char32_t cp = b0 & (0x7F >> want);
  for (size_t i = 1; i < want; ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if ((b & 0xC0) != 0x80) return *len = 1, 0xFFFD;
    cp = (cp << 6) | (b & 0x3F);
  }
  *len = want;
  return cp;
}

// Unicode Normalization Form C (canonical decomposition, then composition) with
// Unicode 9.0's tables, as Hugging Face tokenizers normalizes (its NFC crate is
// that old; the pattern classes above are Oniguruma's newer ones). Text that NFC
// leaves as it is, most text, costs one scan.
std::string nfc(std::string_view s);

}  // namespace amsp::data
