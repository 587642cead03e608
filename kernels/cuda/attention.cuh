// What the two attention paths share (kernels/cuda/attention.cu, fp32 on CUDA
// cores and the entry points of ops.h; kernels/cuda/attention_bf16.cu, bf16 on
// tensor cores): backward's first pass, the tensor-core kernels' entry points,
// and the FLOPs both declare to the emulation's counters.
#pragma once

#include <cstdint>

#include "kernels/common/math.h"
#include "kernels/cuda/api.h"

namespace amsp::kernels::cuda {

// delta[b, h, t] = sum over d of dout * out, one row of one head at a time
// (q's layout [B*T, H*D]; delta [B, H, T]). With round_dout, dout is rounded
// to bf16 first, as the tensor-core path rounds it for dP = dout . v: delta
// is then sum_j P_j dP_j, and dP - delta is 0 where it must be. A: float or
// bf16 (out and dout as the caller's activations are).
template <typename A>
void attention_delta(const A* out, const A* dout, float* delta, int64_t B, int64_t T, int64_t H,
                     int64_t D, bool round_dout, cudaStream_t s);

// Ends the process with one line naming the call, the shape and what the
// path takes, unless the shape is one it takes: `d_ok` (with `d_expected`
// saying which head dims), H a multiple of KV, T within 65535 tiles of `tile`
// rows (the grid's limit), rows of q and of k/v that hold H*D and KV*D values.
// Anything else is a bug in the caller, which no kernel could report.
void require_shape(const char* what, bool d_ok, const char* d_expected, int64_t tile, int64_t T,
                   int64_t H, int64_t KV, int64_t D, int64_t ldq, int64_t ldkv);

// The tensor-core kernels (attention_bf16.cu) behind attention_forward and
// attention_backward with bf16, for the head dims attention_tc_supports.
bool attention_tc_supports(int64_t D);
// Floats of workspace the tensor-core backward needs beyond delta: each query
// head's share of dk and dv when a kv head serves several (H > KV), summed in
// head order afterwards.
int64_t attention_tc_partials(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D);
template <typename A>
void attention_forward_tc(const A* q, const A* k, const A* v, int64_t ldq, int64_t ldkv, float* lse,
                          A* out, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                          cudaStream_t s);
template <typename A>
void attention_backward_tc(const A* q, const A* k, const A* v, int64_t ldq, int64_t ldkv,
                           Rotary rope, const float* lse, const A* out, const A* dout, A* dq, A* dk,
                           A* dv, float* workspace, int64_t B, int64_t T, int64_t H, int64_t KV,
                           int64_t D, cudaStream_t s);

// The FLOPs of `products` matrix products over the causal (query, key) pairs of
// every (sequence, head): 2 D each per pair. Forward makes two (scores, then
// weighted values); backward seven: the dq kernel recomputes scores and dP and
// forms dq, the dk/dv kernel recomputes both again and forms dv and dk.
inline double causal_flops(int products, int64_t B, int64_t T, int64_t H, int64_t D) {
  const double pairs = static_cast<double>(T) * static_cast<double>(T + 1) / 2;
  return products * 2.0 * static_cast<double>(B * H * D) * pairs;
}

}  // namespace amsp::kernels::cuda
