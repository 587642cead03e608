// AMSP_HD marks per-element math that both the CPU kernels and the CUDA kernels
// call, so the CPU test suite exercises the exact arithmetic the GPU runs.
#pragma once

#if defined(__CUDACC__)
#define AMSP_HD __host__ __device__ __forceinline__
#else
#define AMSP_HD inline
#endif
