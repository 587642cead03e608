// The per-dataset checksum of a checkpoint: order-sensitive, yet a sum over
// elements, so the ranks that write (or check) disjoint pieces of a dataset
// add their partial sums (MPI_SUM on uint64, modulo 2^64) to get the whole's.
//
//   checksum = sum over i of mix64(mix64(i) XOR bits(x_i))   (mod 2^64)
//
// i is the element's row-major flat index in the dataset, bits(x_i) its
// IEEE-754 float32 bit pattern, mix64 the SplitMix64 finaliser (core/rng.h).
// Moving a value to another index, or changing any bit of it, changes the
// term. doc/checkpoints.md shows the same sum in five lines of NumPy.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/rng.h"

namespace amsp::ckpt {

inline constexpr const char* kChecksumAlgorithm =
    "sum_i mix64(mix64(i) ^ float32_bits(x_i)) mod 2^64, i = row-major index, "
    "mix64 = SplitMix64 finaliser";

inline uint64_t checksum_term(uint64_t index, uint32_t bits) { return mix64(mix64(index) ^ bits); }

// Partial checksum of n consecutive elements whose first has flat index `first`.
inline uint64_t checksum(const float* x, int64_t n, int64_t first) {
  uint64_t sum = 0;
  for (int64_t k = 0; k < n; ++k) {
    uint32_t bits;
    std::memcpy(&bits, x + k, sizeof bits);
    sum += checksum_term(static_cast<uint64_t>(first + k), bits);
  }
  return sum;
}

}  // namespace amsp::ckpt
