// CUDA implementations of kernels/cuda/ops.cuh. Simple, correct kernels first:
// one thread per element, one block per row for row reductions, cuBLAS for
// products. The arithmetic per element is kernels/common/math.h.
#include <cmath>

#include "kernels/common/math.h"
#include "kernels/cuda/ops.cuh"

namespace amsp::kernels::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

// Sum over a block, result valid in every thread.
__device__ float block_sum(float v) {
  __shared__ float warp_sums[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) / 32;
  v = lane < warps ? warp_sums[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  return v;
}

__device__ float block_max(float v) {
  __shared__ float warp_max[32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_max[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) / 32;
  v = lane < warps ? warp_max[lane] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  return v;
}

__global__ void rmsnorm_forward_kernel(const float* x, const float* w, float* y, float* inv_rms,
                                       int64_t dim, float eps) {
  const float* xr = x + blockIdx.x * dim;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  const float inv = rms_inv(block_sum(ss), dim, eps);
  if (threadIdx.x == 0) inv_rms[blockIdx.x] = inv;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    y[blockIdx.x * dim + i] = rmsnorm_element(xr[i], w[i], inv);
}

__global__ void rmsnorm_dx_kernel(const float* dy, const float* x, const float* w,
                                  const float* inv_rms, float* dx, int64_t dim) {
  const int64_t r = blockIdx.x;
  const float inv = inv_rms[r];
  float c = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) c += w[i] * dy[r * dim + i] * x[r * dim + i];
  const float coef = inv * inv * inv * block_sum(c) / static_cast<float>(dim);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    dx[r * dim + i] = rmsnorm_dx_element(x[r * dim + i], w[i], dy[r * dim + i], inv, coef);
}

// dw[i] += sum_r dy[r, i] * x[r, i] * inv_rms[r]: a thread per column, rows in
// order, so the result is deterministic.
__global__ void rmsnorm_dw_kernel(const float* dy, const float* x, const float* inv_rms, float* dw,
                                  int64_t rows, int64_t dim) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= dim) return;
  float acc = 0.0f;
  for (int64_t r = 0; r < rows; ++r) acc += dy[r * dim + i] * (x[r * dim + i] * inv_rms[r]);
  dw[i] += acc;
}

__global__ void rope_kernel(float* x, const float* cos, const float* sin, int64_t B, int64_t T,
                            int64_t heads, int64_t head_dim, int64_t row_stride, float sign) {
  const int64_t half = head_dim / 2;
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= B * T * heads * half) return;
  const int64_t i = idx % half, h = (idx / half) % heads, row = idx / (half * heads);
  const int64_t pos = row % T;
  float* base = x + row * row_stride + h * head_dim;
  rope_rotate(base[i], base[i + half], cos[pos * half + i], sign * sin[pos * half + i]);
}

__global__ void swiglu_forward_kernel(const float* gate, const float* up, float* out, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = swiglu(gate[i], up[i]);
}

__global__ void swiglu_backward_kernel(const float* gate, const float* up, const float* dout,
                                       float* dgate, float* dup, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  float dg, du;
  swiglu_grad(gate[i], up[i], dout[i], dg, du);
  dgate[i] = dg;
  dup[i] = du;
}

__global__ void embedding_forward_kernel(const int32_t* tokens, const float* table, float* out,
                                         int64_t rows, int64_t dim) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < rows * dim) out[i] = table[static_cast<int64_t>(tokens[i / dim]) * dim + i % dim];
}

__global__ void cross_entropy_forward_kernel(const float* logits, const int32_t* targets,
                                             float* lse, float* losses, int64_t V) {
  const float* row = logits + blockIdx.x * V;
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, row[i]);
  mx = block_max(mx);
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) s += fast_exp(row[i] - mx);
  s = block_sum(s);
  if (threadIdx.x == 0) {
    const float l = mx + logf(s);
    lse[blockIdx.x] = l;
    const int32_t t = targets[blockIdx.x];
    losses[blockIdx.x] = t < 0 ? 0.0f : l - row[t];
  }
}

__global__ void cross_entropy_backward_kernel(float* logits, const int32_t* targets,
                                              const float* lse, int64_t V, float scale) {
  float* row = logits + blockIdx.x * V;
  const int32_t t = targets[blockIdx.x];
  const float l = lse[blockIdx.x];
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
    row[i] = t < 0 ? 0.0f : scale * (fast_exp(row[i] - l) - (i == t ? 1.0f : 0.0f));
}

__global__ void adamw_kernel(float* p, float* m, float* v, const float* g, int64_t n, float lr,
                             float b1, float b2, float eps, float wd, float bc1, float bc2) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) adamw_update_element(p[i], m[i], v[i], g[i], lr, b1, b2, eps, wd, bc1, bc2);
}

}  // namespace

// cuBLAS is column-major: a row-major [M, N] matrix is a column-major [N, M] one.
void linear_forward(cublasHandle_t h, const float* x, const float* w, float* y, int64_t M,
                    int64_t in, int64_t out) {
  const float one = 1.0f, zero = 0.0f;
  cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out), static_cast<int>(M),
              static_cast<int>(in), &one, w, static_cast<int>(in), x, static_cast<int>(in), &zero,
              y, static_cast<int>(out));
}

void linear_backward_input(cublasHandle_t h, const float* dy, const float* w, float* dx, int64_t M,
                           int64_t in, int64_t out) {
  const float one = 1.0f, zero = 0.0f;
  cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(in), static_cast<int>(M),
              static_cast<int>(out), &one, w, static_cast<int>(in), dy, static_cast<int>(out),
              &zero, dx, static_cast<int>(in));
}

void linear_backward_weight(cublasHandle_t h, const float* dy, const float* x, float* dw,
                            int64_t M, int64_t in, int64_t out) {
  const float one = 1.0f;
  cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(in), static_cast<int>(out),
              static_cast<int>(M), &one, x, static_cast<int>(in), dy, static_cast<int>(out), &one,
              dw, static_cast<int>(in));
}

void rmsnorm_forward(const float* x, const float* w, float* y, float* inv_rms, int64_t rows,
                     int64_t dim, float eps, cudaStream_t s) {
  if (rows > 0) rmsnorm_forward_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(x, w, y, inv_rms, dim, eps);
}

void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* inv_rms,
                      float* dx, float* dw, int64_t rows, int64_t dim, cudaStream_t s) {
  if (rows == 0) return;
  rmsnorm_dx_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(dy, x, w, inv_rms, dx, dim);
  rmsnorm_dw_kernel<<<blocks_for(dim), kThreads, 0, s>>>(dy, x, inv_rms, dw, rows, dim);
}

void rope_forward(float* x, const float* cos, const float* sin, int64_t B, int64_t T,
                  int64_t heads, int64_t head_dim, int64_t row_stride, cudaStream_t s) {
  const int64_t n = B * T * heads * (head_dim / 2);
  if (n > 0) rope_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, cos, sin, B, T, heads, head_dim, row_stride, 1.0f);
}

void rope_backward(float* dx, const float* cos, const float* sin, int64_t B, int64_t T,
                   int64_t heads, int64_t head_dim, int64_t row_stride, cudaStream_t s) {
  const int64_t n = B * T * heads * (head_dim / 2);
  if (n > 0) rope_kernel<<<blocks_for(n), kThreads, 0, s>>>(dx, cos, sin, B, T, heads, head_dim, row_stride, -1.0f);
}

void swiglu_forward(const float* gate, const float* up, float* out, int64_t n, cudaStream_t s) {
  if (n > 0) swiglu_forward_kernel<<<blocks_for(n), kThreads, 0, s>>>(gate, up, out, n);
}

void swiglu_backward(const float* gate, const float* up, const float* dout, float* dgate,
                     float* dup, int64_t n, cudaStream_t s) {
  if (n > 0) swiglu_backward_kernel<<<blocks_for(n), kThreads, 0, s>>>(gate, up, dout, dgate, dup, n);
}

void embedding_forward(const int32_t* tokens, const float* table, float* out, int64_t rows,
                       int64_t dim, cudaStream_t s) {
  if (rows * dim > 0)
    embedding_forward_kernel<<<blocks_for(rows * dim), kThreads, 0, s>>>(tokens, table, out, rows, dim);
}

void cross_entropy_forward(const float* logits, const int32_t* targets, float* lse, float* losses,
                           int64_t rows, int64_t V, cudaStream_t s) {
  if (rows > 0)
    cross_entropy_forward_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(logits, targets, lse, losses, V);
}

void cross_entropy_backward(float* logits, const int32_t* targets, const float* lse, int64_t rows,
                            int64_t V, float scale, cudaStream_t s) {
  if (rows > 0)
    cross_entropy_backward_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(logits, targets, lse, V, scale);
}

void adamw_update(float* params, float* m, float* v, const float* grads, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step,
                  cudaStream_t s) {
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step)));
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step)));
  if (n > 0)
    adamw_kernel<<<blocks_for(n), kThreads, 0, s>>>(params, m, v, grads, n, lr, beta1, beta2, eps,
                                                    weight_decay, bc1, bc2);
}

}  // namespace amsp::kernels::cuda
