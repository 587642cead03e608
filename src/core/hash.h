// FNV-1a, 64 bits: a fast hash of names and small keys, equal on every rank
// and every run. Not a checksum of data (ckpt/checksum.h is).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace amsp {

inline constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;

// h continues an earlier hash (default: the start).
inline uint64_t fnv1a(const void* data, size_t n, uint64_t h = kFnvOffset) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

inline uint64_t fnv1a(std::string_view s, uint64_t h = kFnvOffset) { return fnv1a(s.data(), s.size(), h); }

}  // namespace amsp
