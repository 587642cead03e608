// CPU reference kernels for LLaMA, fp32. Activations are row-major
// [rows, features] with rows = B*T (sequence-major); Linear weights are
// [out, in] as in PyTorch. Matrix products go to OpenBLAS (OpenMP build), the
// rest is OpenMP over rows or columns with static schedules and no floating
// atomics: the same inputs give bit-identical outputs on every run with the
// same thread count.
//
// Conventions: functions named *_backward ACCUMULATE (+=) into parameter
// gradients (dw) and, where stated, into input gradients; outputs of forward
// functions are overwritten.
#pragma once

#include <cstdint>

#include "kernels/common/math.h"
#include "kernels/common/quant.h"

namespace amsp::kernels {

// ---- matmul.cpp ---------------------------------------------------------------
// The OpenBLAS kernel set in use ("SkylakeX", "Haswell", ...). At load time,
// if OpenBLAS fell back to its generic "Prescott" kernels on a CPU it does not
// know, and OPENBLAS_CORETYPE is unset, matmul.cpp switches it to the best core
// the CPU's instruction sets allow.
const char* blas_core_name();
// y[M, out] = x[M, in] W^T + beta * y
void linear_forward(const float* x, const float* w, float* y, int64_t M, int64_t in, int64_t out,
                    float beta = 0.0f);
// dx[M, in] = dy[M, out] W + beta * dx
void linear_backward_input(const float* dy, const float* w, float* dx, int64_t M, int64_t in,
                           int64_t out, float beta = 0.0f);
// dw[out, in] += dy^T x
void linear_backward_weight(const float* dy, const float* x, float* dw, int64_t M, int64_t in,
                            int64_t out);
// y[i] += x[i]
void add_inplace(float* y, const float* x, int64_t n);

// ---- norm.cpp -----------------------------------------------------------------
// y = w * x / sqrt(mean(x^2) + eps) per row; inv_rms[rows] kept for backward.
// x, w, dx, dw fp32; y and dy fp32 or bf16 bit patterns (each y computed in
// fp32 and rounded once; dy widened).
void rmsnorm_forward(const float* x, const float* w, float* y, float* inv_rms, int64_t rows,
                     int64_t dim, float eps);
void rmsnorm_forward(const float* x, const float* w, uint16_t* y, float* inv_rms, int64_t rows,
                     int64_t dim, float eps);
// y from x and a saved inv_rms (recomputation in backward, same bits as forward).
void rmsnorm_apply(const float* x, const float* w, const float* inv_rms, float* y, int64_t rows,
                   int64_t dim);
void rmsnorm_apply(const float* x, const float* w, const float* inv_rms, uint16_t* y, int64_t rows,
                   int64_t dim);
// dx += d(norm)/dx^T dy; dw += sum_rows dy * x * inv_rms.
void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* inv_rms,
                      float* dx, float* dw, int64_t rows, int64_t dim);
void rmsnorm_backward(const uint16_t* dy, const float* x, const float* w, const float* inv_rms,
                      float* dx, float* dw, int64_t rows, int64_t dim);

// ---- rope.cpp -----------------------------------------------------------------
// cos/sin tables [max_T, D/2] computed as transformers does in fp32:
// inv_freq[i] = 1 / theta^(2i/D), angle = float(pos) * inv_freq[i].
void rope_table(float* cos, float* sin, int64_t max_T, int64_t head_dim, double theta);
// In-place rotation of x [B*T, row_stride] holding `heads` heads of head_dim
// each from column 0; position = row % T. backward rotates by -angle (the
// transpose), turning d(out) into d(in) in place. x: fp32, or bf16 bit patterns
// (each pair widened, rotated in fp32, stored rounded to nearest even).
void rope_forward(float* x, const float* cos, const float* sin, int64_t B, int64_t T,
                  int64_t heads, int64_t head_dim, int64_t row_stride);
void rope_backward(float* dx, const float* cos, const float* sin, int64_t B, int64_t T,
                   int64_t heads, int64_t head_dim, int64_t row_stride);
void rope_forward(uint16_t* x, const float* cos, const float* sin, int64_t B, int64_t T,
                  int64_t heads, int64_t head_dim, int64_t row_stride);
void rope_backward(uint16_t* dx, const float* cos, const float* sin, int64_t B, int64_t T,
                   int64_t heads, int64_t head_dim, int64_t row_stride);

// ---- attention.cpp ------------------------------------------------------------
// Causal grouped-query attention. q: B*T rows of H*D values, row stride ldq;
// k, v: B*T rows of KV*D values, row stride ldkv (the model's fused projection
// [B*T, (H + 2 KV) D] holds q, k and v side by side: ldq = ldkv = (H + 2 KV) D);
// out: [B*T, H*D]. Query head h reads kv head h / (H / KV), scale 1/sqrt(D).
// probs [B, H, T, T] receives the softmax probabilities and must be kept for
// backward; entries above the diagonal are zero or left unwritten, and never read.
// q and k are taken after RoPE (rope_forward); with rope tables (cos !=
// nullptr, [T, D/2]) backward rotates dq and dk back, the gradients with
// respect to the unrotated q and k.
void attention_forward(const float* q, const float* k, const float* v, int64_t ldq, int64_t ldkv,
                       float* probs, float* out, int64_t B, int64_t T, int64_t H, int64_t KV,
                       int64_t D);
// dout: [B*T, H*D]; dq (row stride ldq), dk, dv (ldkv) are overwritten.
void attention_backward(const float* q, const float* k, const float* v, int64_t ldq, int64_t ldkv,
                        Rotary rope, const float* probs, const float* dout, float* dq, float* dk,
                        float* dv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D);

// ---- mlp.cpp ------------------------------------------------------------------
// out = silu(gate) * up over rows x cols values. gate and up (and dgate, dup)
// are rows of stride ld (the model's fused projection [rows, 2 cols] holds gate
// and up side by side: ld = 2 cols, up = gate + cols); out and dout are
// [rows, cols]. Activations fp32, or bf16 bit patterns: widened, computed in
// fp32 (the same per-element math), stored rounded to nearest even.
void swiglu_forward(const float* gate, const float* up, int64_t ld, float* out, int64_t rows,
                    int64_t cols);
void swiglu_forward(const uint16_t* gate, const uint16_t* up, int64_t ld, uint16_t* out, int64_t rows,
                    int64_t cols);
// dgate, dup from dout (overwritten). With ld == cols, dup may alias dout.
void swiglu_backward(const float* gate, const float* up, int64_t ld, const float* dout,
                     float* dgate, float* dup, int64_t rows, int64_t cols);
void swiglu_backward(const uint16_t* gate, const uint16_t* up, int64_t ld, const uint16_t* dout,
                     uint16_t* dgate, uint16_t* dup, int64_t rows, int64_t cols);

// ---- loss.cpp -----------------------------------------------------------------
// Cross-entropy of logits [rows, V] against targets (target < 0: ignored;
// target >= V fails). lse[rows] (log-sum-exp) kept for backward. Returns the
// loss summed over valid rows, in double, in row order; *count = valid rows.
double cross_entropy_forward(const float* logits, const int32_t* targets, float* lse,
                             int64_t rows, int64_t V, int64_t* count);
// The same on bf16 logits (bit patterns), each widened.
double cross_entropy_forward(const uint16_t* logits, const int32_t* targets, float* lse,
                             int64_t rows, int64_t V, int64_t* count);
// In place: logits := scale * (softmax(logits) - onehot(target)); rows with an
// ignored target become 0.
void cross_entropy_backward(float* logits, const int32_t* targets, const float* lse,
                            int64_t rows, int64_t V, float scale);
// bf16 logits: each entry of the gradient computed in fp32 and rounded once.
void cross_entropy_backward(uint16_t* logits, const int32_t* targets, const float* lse,
                            int64_t rows, int64_t V, float scale);

// ---- embedding.cpp ------------------------------------------------------------
// out[r, :] = table[tokens[r], :]
void embedding_forward(const int32_t* tokens, const float* table, float* out, int64_t rows,
                       int64_t dim);
// dtable[tokens[r], :] += dout[r, :]; deterministic (threads own columns).
void embedding_backward(const int32_t* tokens, const float* dout, float* dtable, int64_t rows,
                        int64_t dim);

// ---- optim.cpp ----------------------------------------------------------------
// AdamW over n elements (see adamw_update_element in kernels/common/math.h);
// step counts from 1.
void adamw_update(float* params, float* m, float* v, const float* grads, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step);

// ---- quant.cpp ----------------------------------------------------------------
// Block quantization (kernels/common/quant.h, doc/compression.md). x holds
// `records` chunks of n values one after another (fp32, or bf16 bit patterns);
// words receives as many records of quant::record_words(n, spec) words, each
// written whole (padding included). Threads share the blocks, or the values of
// a block when there are fewer blocks than threads: max is exact, so the
// records are the same bits with any thread count.
void quantize(const float* x, int64_t n, int64_t records, const quant::Spec& spec, int32_t* words);
void quantize(const uint16_t* x, int64_t n, int64_t records, const quant::Spec& spec,
              int32_t* words);
// y[r n + i] = q * scale for element i of record r, stored as fp32 or bf16
// (rounded to nearest even).
void dequantize(const int32_t* words, int64_t n, int64_t records, const quant::Spec& spec,
                float* y);
void dequantize(const int32_t* words, int64_t n, int64_t records, const quant::Spec& spec,
                uint16_t* y);
// y[i] = the sum over records r = 0, 1, ... in that order of q_r[i] * scale_r,
// every product and every addition rounded to fp32 on its own (no fused
// multiply-add: quant.cpp is compiled without contraction), then stored as
// fp32 or bf16; records == 0 gives 0.
void dequantize_sum(const int32_t* words, int64_t n, int64_t records, const quant::Spec& spec,
                    float* y);
void dequantize_sum(const int32_t* words, int64_t n, int64_t records, const quant::Spec& spec,
                    uint16_t* y);

}  // namespace amsp::kernels
