// What the kernels of kernels/cuda are written against, so that one source is
// compiled by nvcc for the GPU and by the host compiler for the CPU emulation
// (kernels/cuda/emu/simt.h: each block's threads as fibers, __syncthreads as a
// barrier among them, warp shuffles among a warp's 32 fibers, __shared__ per
// block). Kernels use __global__, __device__, __shared__, threadIdx, blockIdx,
// blockDim, gridDim, __syncthreads, __syncwarp, __shfl_xor_sync / __shfl_down_sync /
// __shfl_sync, atomicAdd and atomicMin on int, __fmul_rn and __fadd_rn, and the fp32
// math of <cmath> (expf, logf, sqrtf, fmaxf, fminf, rsqrtf); anything else
// needs the emulation to learn it first.
//
// Launches are written
//     AMSP_LAUNCH(kernel, grid, block, shared_bytes, stream)(arg, ...);
// and dynamic shared memory is declared inside a kernel with
//     AMSP_DYNAMIC_SHARED(float, name);
#pragma once

#include "kernels/cuda/api.h"

#if defined(__CUDACC__)
#define AMSP_LAUNCH(kernel, grid, block, shared_bytes, stream) \
  kernel<<<(grid), (block), (shared_bytes), (stream)>>>
#define AMSP_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#define AMSP_DEVICE_INLINE __device__ __forceinline__
#define AMSP_UNROLL _Pragma("unroll")
#define AMSP_NO_UNROLL _Pragma("unroll 1")
#else
#include "kernels/cuda/emu/simt.h"
#define AMSP_DEVICE_INLINE inline
#define AMSP_UNROLL
#define AMSP_NO_UNROLL
#endif
// AMSP_UNROLL before a loop over a register array's indices (mma fragments,
// accumulators): nvcc then unrolls it whatever its body's size, so that every
// index is a constant and the array stays in registers. A loop it keeps indexes
// the array at run time, which puts the array in local memory (the stack).
// AMSP_NO_UNROLL keeps a loop whose body indexes no register array by its
// counter, where unrolling would only add registers (attention's dq).

// AMSP_LAUNCH is a macro: a kernel's template arguments must hold no comma, so
// a kernel of two dtypes takes them as one type, Dtypes<A, B>, and a kernel of
// a size and a dtype Sized<N, A>.
namespace amsp::kernels::cuda {
template <typename A, typename B>
struct Dtypes {
  using First = A;
  using Second = B;
};
template <int N, typename A>
struct Sized {
  static constexpr int value = N;
  using Type = A;
};
}  // namespace amsp::kernels::cuda
