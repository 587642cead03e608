// Inputs for the quantization tests (kernels/cpu/quant_test.cpp,
// kernels/cuda/quant_test.cpp, src/backend/quant_backend_test.cpp): each block
// of each chunk gets the next kind of awkward input, so that a few hundred
// values hold every case the error bound must survive.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/common/quant.h"
#include "src/core/rng.h"

namespace amsp::kernels::quant_test {

enum Kind {
  kNormal,     // N(0, 1) times 10^(-3..3)
  kTies,       // amax = qmax, the rest k + 1/2: inv and scale are 1, x * inv a tie
  kFirstMax,   // amax at the block's first value
  kLastMax,    // amax at the block's last value
  kOneHuge,    // N(0, 1) and one 1e30
  kDenormals,  // k * 2^-149: amax < 2^-64, x and amax taken up by 2^64
  kZeros,      // +0 and -0
  kTinyInv,    // N(0, 1) * 1e-21: below 2^-64, qmax / amax still finite (the claim of quant.h)
  kLargeInv,   // N(0, 1) * 1e-19: above 2^-64, inv near 1e21
  kBig,        // N(0, 1) * 1e36 and bf16's largest finite value
  kKinds
};

inline const char* kind_name(int k) {
  static const char* names[] = {"normal", "ties", "first-max", "last-max", "one-huge",
                                "denormals", "zeros", "tiny-inv", "large-inv", "big"};
  return names[k];
}

// Block b (counted over all records) of `records` chunks of n has kind (b + shift) % kKinds.
inline int kind_of(int64_t record, int64_t b, int64_t n, const quant::Spec& s, int shift) {
  return static_cast<int>((record * quant::blocks(n, s) + b + shift) % kKinds);
}

inline std::vector<float> values(int64_t n, int64_t records, const quant::Spec& s, uint64_t seed,
                                 int shift = 0) {
  std::vector<float> x(static_cast<size_t>(n * records));
  const float q = static_cast<float>(quant::qmax(s));
  for (int64_t r = 0; r < records; ++r) {
    for (int64_t b = 0; b < quant::blocks(n, s); ++b) {
      const int64_t lo = b * s.block, hi = quant::block_end(b, n, s);
      const int kind = kind_of(r, b, n, s, shift);
      float* v = x.data() + r * n;
      auto normal = [&](int64_t i) {
        return static_cast<float>(random_normal(seed, static_cast<uint64_t>(r), static_cast<uint64_t>(i)));
      };
      auto below = [&](int64_t i, uint64_t m) {
        return static_cast<int64_t>(random_below(seed, 1000 + static_cast<uint64_t>(r), static_cast<uint64_t>(i), m));
      };
      for (int64_t i = lo; i < hi; ++i) {
        switch (kind) {
          case kNormal: v[i] = normal(i) * std::pow(10.0f, static_cast<float>(b % 7 - 3)); break;
          case kTies: {
            const int64_t k = below(i, static_cast<uint64_t>(q));  // 0 .. qmax - 1
            v[i] = (static_cast<float>(k) + 0.5f) * (i % 2 ? -1.0f : 1.0f);
            break;
          }
          case kFirstMax: v[i] = i == lo ? -40.0f : normal(i); break;
          case kLastMax: v[i] = i == hi - 1 ? 40.0f : normal(i); break;
          case kOneHuge: v[i] = normal(i); break;
          case kDenormals: v[i] = static_cast<float>(below(i, 101) - 50) * 0x1p-149f; break;
          case kZeros: v[i] = i % 3 ? -0.0f : 0.0f; break;
          case kTinyInv: v[i] = normal(i) * 1e-21f; break;
          case kLargeInv: v[i] = normal(i) * 1e-19f; break;
          case kBig: v[i] = normal(i) * 1e36f; break;
        }
      }
      if (kind == kTies) v[lo + below(hi, static_cast<uint64_t>(hi - lo))] = -q;
      if (kind == kOneHuge) v[lo + below(hi, static_cast<uint64_t>(hi - lo))] = 1e30f;
      if (kind == kBig) v[lo + below(hi, static_cast<uint64_t>(hi - lo))] = 0x1.fep127f;
    }
  }
  return x;
}

// The error bound of doc/compression.md for a value of a block whose largest
// magnitude is amax, dequantized to fp32: amax / (2 qmax) (half a step of the
// codes), 4.0001 u amax for the roundings of inv, x * inv, the scale and
// q * scale (u = 2^-24), and (qmax + 1) 2^-150 where the scale or the product is
// subnormal.
inline double error_bound(float amax, const quant::Spec& s) {
  const double q = quant::qmax(s);
  return amax / (2 * q) + 4.0001 * 0x1p-24 * amax + (q + 1) * 0x1p-150;
}

}  // namespace amsp::kernels::quant_test
