// Counter-based random numbers: a value is a pure function of (seed, stream,
// index), so any rank can produce any part of a sequence without replaying it,
// and a run restarted at step k draws exactly what it would have drawn.
#pragma once

#include <cmath>
#include <cstdint>

namespace amsp {

// SplitMix64 finaliser: a strong 64-bit mixer (Steele, Lea, Flood 2014).
inline uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A 64-bit random value for (seed, stream, index).
inline uint64_t random_u64(uint64_t seed, uint64_t stream, uint64_t index) {
  return mix64(mix64(mix64(seed) ^ stream) ^ index);
}

// Uniform in [0, 1) with 53 bits.
inline double random_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return static_cast<double>(random_u64(seed, stream, index) >> 11) * 0x1.0p-53;
}

// Uniform integer in [0, n), n > 0, without modulo bias worth mentioning for n << 2^64
// (Lemire's multiply-shift).
inline uint64_t random_below(uint64_t seed, uint64_t stream, uint64_t index, uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(random_u64(seed, stream, index)) * n) >> 64);
}

// Standard normal by Box-Muller from two counter draws.
inline double random_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  const double u1 = 1.0 - random_uniform(seed, stream, 2 * index);  // (0, 1]
  const double u2 = random_uniform(seed, stream, 2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace amsp
