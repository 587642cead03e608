// The CUDA backend's argument checks (internal to cuda_backend*.cpp): the CPU
// backend's size checks (cpu_checks.h) with the device test turned round, so
// that host memory handed to a device kernel is an Error naming the kernel and
// the view, never a wild read.
#pragma once

#include <initializer_list>

#include "backend/cpu_checks.h"

namespace amsp::backend::cuda_checks {

using cpu::Arg;
using cpu::check_sizes;
using cpu::need;
using cpu::product;

inline void check_device(const char* kernel, const char* name, const View& v) {
  if (v.device != Device::kCuda && v.count > 0)
    fail(kernel, ": ", name, " is ", device_name(v.device),
         " memory; the cuda backend reads device memory only");
}

inline void expect(const char* kernel, const char* name, const View& v, DType t) {
  check_device(kernel, name, v);
  if (v.dtype != t)
    fail(kernel, ": ", name, " is ", dtype_name(v.dtype), ", expected ", dtype_name(t));
}

inline void expect_all(const char* kernel, DType t, std::initializer_list<Arg> args) {
  for (const Arg& a : args) expect(kernel, a.name, a.view, t);
}

inline void expect_float(const char* kernel, const char* name, const View& v) {
  check_device(kernel, name, v);
  if (v.dtype != DType::kF32 && v.dtype != DType::kBF16)
    fail(kernel, ": ", name, " is ", dtype_name(v.dtype), ", expected fp32 or bf16");
}

// cuBLAS takes int dimensions.
inline int gemm_dim(const char* kernel, const char* name, int64_t n) {
  if (n > 0x7fffffff) fail(kernel, ": ", name, " = ", n, " exceeds cuBLAS's int dimensions");
  return static_cast<int>(n);
}

}  // namespace amsp::backend::cuda_checks
