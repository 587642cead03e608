// RMSNorm forward, recomputation and backward (kernels/cuda/ops.h), with the
// CPU backend's arithmetic: row sums of squares and of w*dy*x in double, the
// per-element math of kernels/common/math.h. The row sums are block
// reductions (a fixed tree order, not the CPU's), so inv_rms and dx may differ
// from the CPU in the last bit; y and dw follow the CPU's order exactly.
#include "kernels/common/math.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace amsp::kernels::cuda {
namespace {

// One block per row (grid-stride over rows); every thread of a block takes
// part in the reduction, however short the row. T: Dtypes<w's, y's>.
template <typename T>
__global__ void rmsnorm_forward_kernel(const float* x, const typename T::First* w, typename T::Second* y,
                                       float* inv_rms, int64_t rows, int64_t dim, float eps) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * dim;
    double ss = 0.0;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
      ss += static_cast<double>(xr[j]) * xr[j];
    const float inv = rms_inv(static_cast<float>(block_sum(ss)), dim, eps);
    if (threadIdx.x == 0) inv_rms[r] = inv;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
      store(y + r * dim + j, rmsnorm_element(xr[j], load(w[j]), inv));
  }
}

template <typename T>
__global__ void rmsnorm_apply_kernel(const float* x, const typename T::First* w, const float* inv_rms,
                                     typename T::Second* y, int64_t rows, int64_t dim) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float inv = inv_rms[r];
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
      store(y + r * dim + j, rmsnorm_element(x[r * dim + j], load(w[j]), inv));
  }
}

// dx += inv * w*dy - x * coef, coef = inv^3 * sum_j(w*dy*x) / dim, per row.
// T: Dtypes<w's, dy's>.
template <typename T>
__global__ void rmsnorm_dx_kernel(const typename T::Second* dy, const float* x, const typename T::First* w,
                                  const float* inv_rms, float* dx, int64_t rows, int64_t dim) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * dim;
    const typename T::Second* dyr = dy + r * dim;
    const float inv = inv_rms[r];
    double c = 0.0;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
      c += static_cast<double>(load(w[j]) * load(dyr[j])) * xr[j];
    c = block_sum(c);
    const float coef = static_cast<float>(c * inv * inv * inv / static_cast<double>(dim));
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
      dx[r * dim + j] += rmsnorm_dx_element(xr[j], load(w[j]), load(dyr[j]), inv, coef);
  }
}

AMSP_DEVICE_INLINE void add_to(float* dst, float c) { *dst += c; }
AMSP_DEVICE_INLINE void add_to(bf16* dst, float c) {
  *dst = float_to_bf16(bf16_to_float(*dst) + c);
}

// dw[j] += sum over rows of dy * (x * inv), in two launches spread over the
// device: the sums of each chunk of kRmsnormDwRows rows (math.h) per column, a
// block per (256 columns, chunk), in double; then per column the chunks in
// order, added to dw once. The CPU sums in the same order.
template <typename DY>
__global__ void rmsnorm_dw_chunks_kernel(const DY* dy, const float* x, const float* inv_rms,
                                         double* partials, int64_t rows, int64_t dim) {
  const int64_t chunks = (rows + kRmsnormDwRows - 1) / kRmsnormDwRows;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < dim;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x)
    for (int64_t c = blockIdx.y; c < chunks; c += gridDim.y) {
      const int64_t r1 = (c + 1) * kRmsnormDwRows < rows ? (c + 1) * kRmsnormDwRows : rows;
      double acc = 0.0;
      for (int64_t r = c * kRmsnormDwRows; r < r1; ++r)
        acc += static_cast<double>(load(dy[r * dim + j]) * (x[r * dim + j] * inv_rms[r]));
      partials[c * dim + j] = acc;
    }
}

template <typename DW>
__global__ void rmsnorm_dw_sum_kernel(const double* partials, DW* dw, int64_t chunks, int64_t dim) {
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < dim;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double acc = 0.0;
    for (int64_t c = 0; c < chunks; ++c) acc += partials[c * dim + j];
    add_to(dw + j, static_cast<float>(acc));
  }
}

}  // namespace

template <typename W, typename Y>
void rmsnorm_forward(const float* x, const W* w, Y* y, float* inv_rms, int64_t rows, int64_t dim, float eps,
                     cudaStream_t s) {
  using T = Dtypes<W, Y>;
  if (rows > 0)
    AMSP_LAUNCH(rmsnorm_forward_kernel<T>, grid_for(rows, 1), kBlockThreads, 0, s)(
        x, w, y, inv_rms, rows, dim, eps);
}

template <typename W, typename Y>
void rmsnorm_apply(const float* x, const W* w, const float* inv_rms, Y* y, int64_t rows, int64_t dim,
                   cudaStream_t s) {
  using T = Dtypes<W, Y>;
  if (rows > 0 && dim > 0)
    AMSP_LAUNCH(rmsnorm_apply_kernel<T>, grid_for(rows, 1), kBlockThreads, 0, s)(
        x, w, inv_rms, y, rows, dim);
}

int64_t rmsnorm_backward_workspace(int64_t rows, int64_t dim) {
  return (rows + kRmsnormDwRows - 1) / kRmsnormDwRows * dim;
}

template <typename DY, typename W, typename DW>
void rmsnorm_backward(const DY* dy, const float* x, const W* w, const float* inv_rms, float* dx, DW* dw,
                      int64_t rows, int64_t dim, double* workspace, cudaStream_t s) {
  if (rows == 0 || dim == 0) return;
  using T = Dtypes<W, DY>;
  AMSP_LAUNCH(rmsnorm_dx_kernel<T>, grid_for(rows, 1), kBlockThreads, 0, s)(
      dy, x, w, inv_rms, dx, rows, dim);
  const int64_t chunks = (rows + kRmsnormDwRows - 1) / kRmsnormDwRows;
  const dim3 grid(grid_for(dim), grid_for(chunks, 1, 65535));
  AMSP_LAUNCH(rmsnorm_dw_chunks_kernel<DY>, grid, kBlockThreads, 0, s)(dy, x, inv_rms, workspace, rows, dim);
  AMSP_LAUNCH(rmsnorm_dw_sum_kernel<DW>, grid_for(dim), kBlockThreads, 0, s)(workspace, dw, chunks, dim);
}

// Every combination of fp32 and bf16: w (and dw) a parameter's dtype, y and dy
// the activations'.
#define AMSP_RMSNORM(W, A)                                                                           \
  template void rmsnorm_forward(const float*, const W*, A*, float*, int64_t, int64_t, float, cudaStream_t); \
  template void rmsnorm_apply(const float*, const W*, const float*, A*, int64_t, int64_t, cudaStream_t);    \
  template void rmsnorm_backward(const A*, const float*, const W*, const float*, float*, float*, int64_t,    \
                                 int64_t, double*, cudaStream_t);                                           \
  template void rmsnorm_backward(const A*, const float*, const W*, const float*, float*, bf16*, int64_t,     \
                                 int64_t, double*, cudaStream_t);
AMSP_RMSNORM(float, float)
AMSP_RMSNORM(float, bf16)
AMSP_RMSNORM(bf16, float)
AMSP_RMSNORM(bf16, bf16)
#undef AMSP_RMSNORM

}  // namespace amsp::kernels::cuda
