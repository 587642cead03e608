// Strict number parsing for user input: the whole text must be the number.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace amsp {

inline std::optional<int64_t> parse_int(const std::string& text) {
  size_t used = 0;
  try {
    const long long v = std::stoll(text, &used);
    if (used == text.size()) return v;
  } catch (...) {
  }
  return std::nullopt;
}

inline std::optional<double> parse_double(const std::string& text) {
  size_t used = 0;
  try {
    const double v = std::stod(text, &used);
    if (used == text.size()) return v;
  } catch (...) {
  }
  return std::nullopt;
}

}  // namespace amsp
