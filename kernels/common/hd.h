// AMSP_HD marks per-element math that both the CPU kernels and the CUDA kernels
// call: one source for both, which the CPU tests exercise. (The CUDA kernels
// call the same functions; doc/gpu.md says what has run where.)
#pragma once

#if defined(__CUDACC__)
#define AMSP_HD __host__ __device__ __forceinline__
#else
#define AMSP_HD inline
#endif
