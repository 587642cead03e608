// The CUDA kernels of a LLaMA training step, bf16 storage with fp32
// accumulation. Layouts and semantics are kernels/cpu/ops.h's and the CPU
// backend's (src/backend/cpu_backend.h): [rows, features] row-major
// activations, [out, in] weights; *_backward ACCUMULATES into parameter
// gradients (dw, dtable) and, where stated, into input gradients; forward
// outputs are overwritten. bf16 values are uint16_t bit patterns, converted by
// kernels/common/math.h (round to nearest even), as on the CPU.
//
// Every function takes device pointers and a stream, enqueues its kernels on
// that stream and returns; none allocates, synchronises or checks errors (the
// caller checks cudaGetLastError). Counts of zero enqueue nothing. Where a
// function needs scratch memory, a *_workspace function says how much, and the
// caller passes it.
//
// Determinism: no floating-point atomics anywhere; every reduction has a fixed
// order that depends only on the shapes, so equal inputs give equal bits on
// every run.
//
// Matrix products are not here: the backend calls cuBLASLt (bf16 or fp32
// inputs, fp32 compute, beta * C added and the result stored once in its dtype
// by the epilogue; src/backend/cuda_gemm.h).
#pragma once

#include <cstdint>

#include "kernels/common/math.h"
#include "kernels/common/quant.h"
#include "kernels/cuda/api.h"

namespace amsp::kernels::cuda {

using bf16 = uint16_t;

// ---- conversions and elementwise (n elements) ---------------------------------------
void to_bf16(const float* x, bf16* y, int64_t n, cudaStream_t s);  // round to nearest even
void to_f32(const bf16* x, float* y, int64_t n, cudaStream_t s);   // exact
// y = round_bf16(x) held in fp32; y may be x.
void round_bf16_values(const float* x, float* y, int64_t n, cudaStream_t s);
// dst = dst + src in fp32, stored in dst's dtype (rounded once).
void add(float* dst, const float* src, int64_t n, cudaStream_t s);
void add(float* dst, const bf16* src, int64_t n, cudaStream_t s);
void add(bf16* dst, const float* src, int64_t n, cudaStream_t s);
void add(bf16* dst, const bf16* src, int64_t n, cudaStream_t s);

// Sum of squares in double: per chunk of kSumSquaresChunk elements, then the
// chunks by one block in a fixed order; *out (device) receives the total.
// partials holds sum_squares_chunks(n) doubles.
constexpr int64_t kSumSquaresChunk = 1 << 14;
int64_t sum_squares_chunks(int64_t n);
void sum_squares(const float* x, int64_t n, double* partials, double* out, cudaStream_t s);
void sum_squares(const bf16* x, int64_t n, double* partials, double* out, cudaStream_t s);
// The same, added into *acc (device) instead: *acc = *acc + total, one double addition.
void sum_squares_add(const float* x, int64_t n, double* partials, double* acc, cudaStream_t s);
void sum_squares_add(const bf16* x, int64_t n, double* partials, double* acc, cudaStream_t s);
// *scale = max_norm / (norm + 1e-6) rounded to fp32 when max_norm > 0 and norm > max_norm,
// else 1, for norm = sqrt(*sumsq / divisor): the engine's clipping factor, in double.
void clip_scale(const double* sumsq, double divisor, double max_norm, float* scale, cudaStream_t s);
// x[0..n) = value.
void fill_i32(int32_t* x, int32_t value, int64_t n, cudaStream_t s);

// ---- embedding -------------------------------------------------------------------------
// out[r, :] = table[tokens[r], :] (tokens are checked by the caller).
void embedding_forward(const int32_t* tokens, const float* table, float* out, int64_t rows,
                       int64_t dim, cudaStream_t s);
void embedding_forward(const int32_t* tokens, const bf16* table, float* out, int64_t rows,
                       int64_t dim, cudaStream_t s);
// dtable[tokens[r], :] += dout[r, :], deterministically: the rows are grouped by
// token (a stable counting sort on the device) and each token's rows summed in
// row order. fp32 table: added into the table row by row, as the CPU kernel
// does; bf16 table: summed in fp32, then added and rounded once per element.
// workspace: embedding_backward_workspace(rows, vocab) int32 elements.
int64_t embedding_backward_workspace(int64_t rows, int64_t vocab);
void embedding_backward(const int32_t* tokens, const float* dout, float* dtable, int64_t rows,
                        int64_t dim, int64_t vocab, int32_t* workspace, cudaStream_t s);
void embedding_backward(const int32_t* tokens, const float* dout, bf16* dtable, int64_t rows,
                        int64_t dim, int64_t vocab, int32_t* workspace, cudaStream_t s);

// ---- RMSNorm (w, dw: fp32 or bf16; y, dy: fp32 or bf16 activations) -----------------------
// y = w * (x * inv_rms), inv_rms[rows] kept; apply recomputes y from inv_rms.
template <typename W, typename Y>
void rmsnorm_forward(const float* x, const W* w, Y* y, float* inv_rms, int64_t rows, int64_t dim,
                     float eps, cudaStream_t s);
template <typename W, typename Y>
void rmsnorm_apply(const float* x, const W* w, const float* inv_rms, Y* y, int64_t rows, int64_t dim,
                   cudaStream_t s);
// dx += d(norm)/dx^T dy;  dw (+)= sum over rows of dy * x * inv_rms, each column
// summed in double in chunks of kRmsnormDwRows rows and the chunks in order
// (kernels/common/math.h, as the CPU does), then added to dw (add_dw) or
// written, rounded once.
// workspace: rmsnorm_backward_workspace(rows, dim) doubles. dx16, unless
// null, receives the updated dx rounded to bf16 (rows x dim, as dx).
int64_t rmsnorm_backward_workspace(int64_t rows, int64_t dim);
template <typename DY, typename W, typename DW>
void rmsnorm_backward(const DY* dy, const float* x, const W* w, const float* inv_rms, float* dx,
                      bf16* dx16, DW* dw, bool add_dw, int64_t rows, int64_t dim, double* workspace,
                      cudaStream_t s);

// ---- RoPE (tables from kernels/cpu rope_table, copied to the device) -----------------
// A: float or bf16 values, rotated in place.
template <typename A>
void rope_forward(A* x, const float* cos, const float* sin, int64_t B, int64_t T, int64_t heads,
                  int64_t head_dim, int64_t row_stride, cudaStream_t s);
template <typename A>
void rope_backward(A* dx, const float* cos, const float* sin, int64_t B, int64_t T, int64_t heads,
                   int64_t head_dim, int64_t row_stride, cudaStream_t s);

// ---- attention: fused, causal, grouped-query, FlashAttention-2 style ------------------
// q: B*T rows of H*D values, row stride ldq; k, v: B*T rows of KV*D values, row
// stride ldkv (kernels/cpu/ops.h: the model's fused projection has ldq = ldkv =
// (H + 2 KV) D); out, dout: [B*T, H*D]; dq, dk, dv as q, k, v. Query head h
// reads kv head h / (H / KV); scale 1/sqrt(D). Tiled with an online softmax: no T x T matrix in
// memory. Forward keeps lse [B, H, T] (log-sum-exp of each row of scaled scores) for backward.
// Backward overwrites dq, dk, dv; workspace holds attention_backward_workspace(B, T, H, KV, D,
// bf16) floats (rowsum(dout * out), and with bf16 and H > KV each query head's share of dk and dv).
// With bf16 (the backend's compute() == kBF16) the products take bf16 inputs:
// q, k, v and dout are rounded to bf16 as they are read. Head dims that are
// multiples of 16 up to 128 then run on tensor cores (attention_bf16.cu), which
// also round the probabilities and their gradients to bf16 for the products
// that take them; other head dims run the fp32 kernels on the rounded inputs.
// A: the activations q, k, v, out, dout, dq, dk, dv, all float or all bf16
// (read as they are, each output the fp32 result rounded once); lse and the
// workspace are fp32. q and k are taken after RoPE (rope_forward, in place),
// and with rope tables (rope.cos != nullptr, [T, D/2]) backward rotates dq and
// dk back before it stores them (each rounded once): the gradients with
// respect to the unrotated q and k, with no pass of their own. Why RoPE is a
// pass of its own before forward and not applied as the kernels read: a key
// row is read by every query tile of every query head of its group, and would
// be rotated each time (doc/gpu.md, "The kernels"). kernels/cpu/ops.h is the
// same contract.
int64_t attention_saved_count(int64_t B, int64_t T, int64_t H);
// Tiles of 16 rows a warp of the tensor-core kernels where the head dim allows
// two (D <= 64; attention_bf16.cu): 1, the default (the faster on an H200), or
// 2, kept so that a GPU can time the two side by side in one run. The same
// bits either way. The CUDA backend sets it from AMSP_ATTENTION_WARP_TILES.
void set_attention_warp_tiles(int tiles);
int attention_warp_tiles();
int64_t attention_backward_workspace(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, bool bf16);
template <typename A>
void attention_forward(const A* q, const A* k, const A* v, int64_t ldq, int64_t ldkv, float* lse,
                       A* out, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, bool bf16,
                       cudaStream_t s);
template <typename A>
void attention_backward(const A* q, const A* k, const A* v, int64_t ldq, int64_t ldkv, Rotary rope,
                        const float* lse, const A* out, const A* dout, A* dq, A* dk, A* dv,
                        float* workspace, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                        bool bf16, cudaStream_t s);

// ---- SwiGLU -----------------------------------------------------------------------------
// The layout of kernels/cpu/ops.h: gate, up, dgate and dup rows of stride ld,
// out and dout [rows, cols]; with ld == cols, dup may alias dout. A: float or
// bf16 activations, all of one dtype.
template <typename A>
void swiglu_forward(const A* gate, const A* up, int64_t ld, A* out, int64_t rows, int64_t cols,
                    cudaStream_t s);
template <typename A>
void swiglu_backward(const A* gate, const A* up, int64_t ld, const A* dout, A* dgate, A* dup,
                     int64_t rows, int64_t cols, cudaStream_t s);

// ---- cross-entropy ------------------------------------------------------------------------
// Per row: lse[r] and losses[r] = lse - logit[target] (0 for target < 0). A
// target >= V is never read past: its row's loss is 0 and *bad_row (device,
// set by the caller to INT32_MAX) receives the smallest such row. Z: float or
// bf16 logits.
template <typename Z>
void cross_entropy_forward(const Z* logits, const int32_t* targets, float* lse, float* losses,
                           int32_t* bad_row, int64_t rows, int64_t V, cudaStream_t s);
// After cross_entropy_forward: acc[0] += the losses of rows with a target >= 0, summed
// in double by one block in a fixed order, acc[1] += their count (as a double); if
// *bad_row names a row (< INT32_MAX) and acc[2] is 0: acc[2] = that row + 1, acc[3] =
// its target.
void accumulate_loss(const float* losses, const int32_t* targets, const int32_t* bad_row,
                     int64_t rows, double* acc, cudaStream_t s);
// In place: logits := scale * (softmax - onehot); rows with target < 0 become 0.
// Targets must be < V (the forward reported any that are not). bf16 logits: each
// entry of the gradient rounded once.
template <typename Z>
void cross_entropy_backward(Z* logits, const int32_t* targets, const float* lse, int64_t rows, int64_t V,
                            float scale, cudaStream_t s);

// ---- AdamW, multi-tensor -------------------------------------------------------------------
// kernels/common/math.h adamw_update_element on every element of every tensor,
// the gradient first multiplied by grad_scale; copy (if not null) receives the
// updated master in its dtype. The states are read from master_in, m_in and
// v_in and written to master, m and v: the same memory in place, other memory
// out of place. One launch covers up to kAdamWTensors tensors.
struct AdamWHyper {
  float lr, beta1, beta2, eps, bias_correction1, bias_correction2, grad_scale;
  const float* scale;  // device; when not null, the gradient is multiplied by *scale instead
};
struct AdamWTensor {
  const float* master_in;
  const float* m_in;
  const float* v_in;
  float* master;
  float* m;
  float* v;
  const void* grad;  // fp32 or bf16, as grad_bf16 says
  void* copy;        // null, fp32 or bf16, as copy_bf16 says
  int64_t n;
  bool grad_bf16;
  bool copy_bf16;
  float weight_decay;  // per tensor: norms and embeddings may have none
};
constexpr int kAdamWTensors = 16;
void adamw(const AdamWTensor* tensors, int count, const AdamWHyper& hyper, cudaStream_t s);

// ---- block quantization (kernels/common/quant.h) -------------------------------------------
// kernels/cpu/ops.h's quantize, dequantize and dequantize_sum, to the bit (quant.cu says
// how the work is split). x: `records` chunks of n values; words: as many records of
// quant::record_words(n, spec) words, written whole; y: fp32 or bf16.
void quantize(const float* x, int64_t n, int64_t records, const quant::Spec& spec, int32_t* words,
              cudaStream_t s);
void quantize(const bf16* x, int64_t n, int64_t records, const quant::Spec& spec, int32_t* words,
              cudaStream_t s);
// y[r n + i] = q * scale of element i of record r.
void dequantize(const int32_t* words, int64_t n, int64_t records, const quant::Spec& spec, float* y,
                cudaStream_t s);
void dequantize(const int32_t* words, int64_t n, int64_t records, const quant::Spec& spec, bf16* y,
                cudaStream_t s);
// y[i] = sum over r = 0, 1, ... in order of q_r[i] * scale_r, each product and addition
// rounded to fp32 on its own; records == 0 gives 0.
void dequantize_sum(const int32_t* words, int64_t n, int64_t records, const quant::Spec& spec,
                    float* y, cudaStream_t s);
void dequantize_sum(const int32_t* words, int64_t n, int64_t records, const quant::Spec& spec,
                    bf16* y, cudaStream_t s);

}  // namespace amsp::kernels::cuda
