// The CPU backend's argument checks and dtype conversion loops (internal to
// cpu_backend*.cpp). Every check fails with one line that starts with the
// kernel's name and names the view or size at fault.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "backend/buffer.h"
#include "core/error.h"
#include "kernels/common/math.h"

namespace amsp::backend::cpu {

inline void check_device(const char* kernel, const char* name, const View& v) {
  if (v.device != Device::kCpu)
    fail(kernel, ": ", name, " is ", device_name(v.device),
         " memory; the cpu backend reads host memory only");
}

// v must be of dtype t.
inline void expect(const char* kernel, const char* name, const View& v, DType t) {
  check_device(kernel, name, v);
  if (v.dtype != t)
    fail(kernel, ": ", name, " is ", dtype_name(v.dtype), ", expected ", dtype_name(t));
}

// A view and the name a message calls it by.
struct Arg {
  const char* name;
  const View& view;
};

// Every view must be of dtype t.
inline void expect_all(const char* kernel, DType t, std::initializer_list<Arg> args) {
  for (const Arg& a : args) expect(kernel, a.name, a.view, t);
}

// v must be fp32 or bf16 (a parameter, a gradient, or an operand of copy/add).
inline void expect_float(const char* kernel, const char* name, const View& v) {
  check_device(kernel, name, v);
  if (v.dtype != DType::kF32 && v.dtype != DType::kBF16)
    fail(kernel, ": ", name, " is ", dtype_name(v.dtype), ", expected fp32 or bf16");
}

// v must hold at least n elements.
inline void need(const char* kernel, const char* name, const View& v, int64_t n) {
  if (v.count < n) fail(kernel, ": ", name, " holds ", v.count, " elements, needs ", n);
}

// Sizes must not be negative.
inline void check_sizes(const char* kernel,
                        std::initializer_list<std::pair<const char*, int64_t>> sizes) {
  for (const auto& [name, value] : sizes)
    if (value < 0) fail(kernel, ": ", name, " = ", value, " is negative");
}

// The product of non-negative sizes; Error if it overflows int64.
inline int64_t product(const char* kernel, std::initializer_list<int64_t> sizes) {
  int64_t p = 1;
  for (int64_t s : sizes)
    if (__builtin_mul_overflow(p, s, &p)) fail(kernel, ": sizes overflow 64 bits");
  return p;
}

// ---- conversions, parallel over elements ------------------------------------------

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
