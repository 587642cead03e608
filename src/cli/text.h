// Small helpers for the commands' text tables.
#pragma once

#include <cstdio>
#include <string>

namespace amsp::cli {

// One number through a printf format: fmt("%.3f", x).
inline std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// s padded with spaces to `width`, right-aligned (numbers) or left (labels).
inline std::string pad(std::string s, size_t width, bool right = true) {
  if (s.size() >= width) return s;
  return right ? std::string(width - s.size(), ' ') + s : s + std::string(width - s.size(), ' ');
}

}  // namespace amsp::cli
