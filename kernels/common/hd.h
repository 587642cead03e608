// AMSP_HD marks per-element math that both the CPU kernels and the CUDA kernels
// call: one source for both, which the CPU tests exercise. (The CUDA kernels
// compile against it; no GPU run has checked them yet.)
#pragma once

#if defined(__CUDACC__)
#define AMSP_HD __host__ __device__ __forceinline__
#else
#define AMSP_HD inline
#endif
