// The CPU backend's dtype conversion loops, parallel over elements (internal to cpu_backend*.cpp);
// its argument checks are the backends' shared ones (checks.h).
#pragma once

#include <cstdint>

#include "kernels/common/math.h"

namespace amsp::backend::cpu {

inline void widen(const uint16_t* src, float* dst, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = kernels::bf16_to_float(src[i]);
}

inline void round_to_bf16(const float* src, uint16_t* dst, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = kernels::float_to_bf16(src[i]);
}

// dst = the fp32 values of src rounded to bf16.
inline void round_values(const float* src, float* dst, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = kernels::round_bf16(src[i]);
}

}  // namespace amsp::backend::cpu
