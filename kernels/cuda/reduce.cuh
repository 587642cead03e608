// Warp and block reductions for the kernels of kernels/cuda (attention.cu
// included), in an order fixed by blockDim alone, so equal inputs give equal
// bits on every run and every GPU.
//
// warp_reduce: a butterfly over the 32 lanes by __shfl_xor_sync. At every step
// lane i combines (v_i, v_{i^o}) and lane i^o combines (v_{i^o}, v_i); the ops
// here are commutative (a + b == b + a exactly in IEEE arithmetic, max too), so
// all 32 lanes end with the same bits and no broadcast is needed.
//
// block_reduce: warp_reduce in each warp, the warps' results through shared
// memory, then every warp reduces those in the same butterfly: every thread of
// the block returns the same bits. Requirements:
//   - a one-dimensional block whose size is a multiple of 32 (at most 1024);
//   - every thread of the block calls it (no early return before it): it
//     contains __syncthreads, and the emulation fails a divergent barrier;
//   - it may be called again at once: it ends with a barrier, so the next
//     call's writes to the shared slots cannot overtake this call's reads.
#pragma once

#include <cmath>

#include "kernels/cuda/simt.h"

namespace amsp::kernels::cuda {

constexpr unsigned kFullWarp = 0xffffffffu;

struct SumOp {
  template <typename T>
  AMSP_DEVICE_INLINE T operator()(T a, T b) const {
    return a + b;
  }
};

// A NaN wins (a row holding one must show it), else the larger operand. Not
// bit-symmetric only where no one cares: max(+0, -0) and two NaNs' payloads.
struct MaxOp {
  template <typename T>
  AMSP_DEVICE_INLINE T operator()(T a, T b) const {
    return a != a ? a : (b != b || b > a) ? b : a;
  }
};

template <typename T, typename Op>
AMSP_DEVICE_INLINE T warp_reduce(T v, Op op) {
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(kFullWarp, v, offset));
  return v;
}

// `identity` fills the lanes beyond the block's warp count (0 for sums, -inf
// for max).
template <typename T, typename Op>
AMSP_DEVICE_INLINE T block_reduce(T v, Op op, T identity) {
  __shared__ T warp_results[32];
  v = warp_reduce(v, op);
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_results[warp] = v;
  __syncthreads();
  v = lane < blockDim.x / 32 ? warp_results[lane] : identity;
  v = warp_reduce(v, op);
  __syncthreads();
  return v;
}

template <typename T>
AMSP_DEVICE_INLINE T block_sum(T v) {
  return block_reduce(v, SumOp{}, T(0));
}

AMSP_DEVICE_INLINE float block_max(float v) { return block_reduce(v, MaxOp{}, -INFINITY); }

// ---- launch shapes ---------------------------------------------------------------

// Threads of the one-dimensional blocks most kernels use (a multiple of 32).
constexpr int kBlockThreads = 256;

// Blocks for a grid-stride loop over n items at `per_block` items per block
// pass, capped: beyond the cap each thread takes several items.
inline unsigned grid_for(int64_t n, int64_t per_block = kBlockThreads, int64_t cap = 1 << 16) {
  const int64_t blocks = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < cap ? blocks : cap);
}

}  // namespace amsp::kernels::cuda
