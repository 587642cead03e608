// CUDA kernels for LLaMA, fp32, mirroring kernels/cpu/ops.h: same layouts
// ([B*T, features] row-major activations, [out, in] weights), same
// accumulate-into-gradients conventions, device pointers, one stream per call.
// The per-element arithmetic is kernels/common/math.h, shared with the CPU
// reference, which is what the test suite checks.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace amsp::kernels::cuda {

// y[M, out] = x[M, in] W^T
void linear_forward(cublasHandle_t h, const float* x, const float* w, float* y, int64_t M,
                    int64_t in, int64_t out);
// dx[M, in] = dy[M, out] W
void linear_backward_input(cublasHandle_t h, const float* dy, const float* w, float* dx, int64_t M,
                           int64_t in, int64_t out);
// dw[out, in] += dy^T x
void linear_backward_weight(cublasHandle_t h, const float* dy, const float* x, float* dw,
                            int64_t M, int64_t in, int64_t out);

void rmsnorm_forward(const float* x, const float* w, float* y, float* inv_rms, int64_t rows,
                     int64_t dim, float eps, cudaStream_t s);
// dx (overwritten), dw += (one block per column tile: deterministic).
void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* inv_rms,
                      float* dx, float* dw, int64_t rows, int64_t dim, cudaStream_t s);

void rope_forward(float* x, const float* cos, const float* sin, int64_t B, int64_t T,
                  int64_t heads, int64_t head_dim, int64_t row_stride, cudaStream_t s);
void rope_backward(float* dx, const float* cos, const float* sin, int64_t B, int64_t T,
                   int64_t heads, int64_t head_dim, int64_t row_stride, cudaStream_t s);

void swiglu_forward(const float* gate, const float* up, float* out, int64_t n, cudaStream_t s);
void swiglu_backward(const float* gate, const float* up, const float* dout, float* dgate,
                     float* dup, int64_t n, cudaStream_t s);

void embedding_forward(const int32_t* tokens, const float* table, float* out, int64_t rows,
                       int64_t dim, cudaStream_t s);

// Per-row log-sum-exp and loss (0 for ignored rows); the caller sums losses.
void cross_entropy_forward(const float* logits, const int32_t* targets, float* lse, float* losses,
                           int64_t rows, int64_t V, cudaStream_t s);
void cross_entropy_backward(float* logits, const int32_t* targets, const float* lse, int64_t rows,
                            int64_t V, float scale, cudaStream_t s);

void adamw_update(float* params, float* m, float* v, const float* grads, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step,
                  cudaStream_t s);

}  // namespace amsp::kernels::cuda
