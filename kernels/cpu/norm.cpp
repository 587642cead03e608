// RMSNorm forward and backward (transformers' LlamaRMSNorm, fp32), on an fp32
// input x and fp32 or bf16 y and dy (widened on load, rounded on store).
#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels/common/math.h"
#include "kernels/cpu/ops.h"

namespace amsp::kernels {
namespace {

template <typename Y>
void forward_rows(const float* x, const float* w, Y* y, float* inv_rms, int64_t rows, int64_t dim,
                  float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    Y* yr = y + r * dim;
    // Sum of squares in double: closer to torch's pairwise fp32 mean than a
    // naive fp32 running sum, and still vectorised.
    double ss = 0.0;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < dim; ++j) ss += static_cast<double>(xr[j]) * xr[j];
    const float inv = rms_inv(static_cast<float>(ss), dim, eps);
    inv_rms[r] = inv;
#pragma omp simd
    for (int64_t j = 0; j < dim; ++j) store(yr + j, rmsnorm_element(xr[j], w[j], inv));
  }
}

template <typename Y>
void apply_rows(const float* x, const float* w, const float* inv_rms, Y* y, int64_t rows, int64_t dim) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    Y* yr = y + r * dim;
    const float inv = inv_rms[r];
#pragma omp simd
    for (int64_t j = 0; j < dim; ++j) store(yr + j, rmsnorm_element(xr[j], w[j], inv));
  }
}

template <typename DY>
void backward_rows(const DY* dy, const float* x, const float* w, const float* inv_rms, float* dx, float* dw,
                   int64_t rows, int64_t dim) {
  // dx, row-parallel.
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    const DY* dyr = dy + r * dim;
    float* dxr = dx + r * dim;
    const float inv = inv_rms[r];
    double c = 0.0;
#pragma omp simd reduction(+ : c)
    for (int64_t j = 0; j < dim; ++j) c += static_cast<double>(w[j] * load(dyr[j])) * xr[j];
    const float coef = static_cast<float>(c * inv * inv * inv / static_cast<double>(dim));
#pragma omp simd
    for (int64_t j = 0; j < dim; ++j) dxr[j] += rmsnorm_dx_element(xr[j], w[j], load(dyr[j]), inv, coef);
  }
  // dw: each thread owns a contiguous range of columns and walks the rows in
  // order, in chunks of kRmsnormDwRows (math.h), so every column's sum has a
  // fixed order whatever the thread count, and the CUDA kernel's.
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t c0 = dim * t / nt, c1 = dim * (t + 1) / nt;
    if (c1 > c0) {
      std::vector<double> acc(c1 - c0, 0.0), chunk(c1 - c0);
      for (int64_t r0 = 0; r0 < rows; r0 += kRmsnormDwRows) {
        std::fill(chunk.begin(), chunk.end(), 0.0);
        double* a = chunk.data() - c0;
        for (int64_t r = r0; r < std::min(rows, r0 + kRmsnormDwRows); ++r) {
          const float* xr = x + r * dim;
          const DY* dyr = dy + r * dim;
          const float inv = inv_rms[r];
#pragma omp simd
          for (int64_t j = c0; j < c1; ++j) a[j] += static_cast<double>(load(dyr[j]) * (xr[j] * inv));
        }
        for (size_t j = 0; j < acc.size(); ++j) acc[j] += chunk[j];
      }
      for (int64_t j = c0; j < c1; ++j) dw[j] += static_cast<float>(acc[j - c0]);
    }
  }
}

}  // namespace

void rmsnorm_forward(const float* x, const float* w, float* y, float* inv_rms, int64_t rows, int64_t dim,
                     float eps) {
  forward_rows(x, w, y, inv_rms, rows, dim, eps);
}

void rmsnorm_forward(const float* x, const float* w, uint16_t* y, float* inv_rms, int64_t rows, int64_t dim,
                     float eps) {
  forward_rows(x, w, y, inv_rms, rows, dim, eps);
}

void rmsnorm_apply(const float* x, const float* w, const float* inv_rms, float* y, int64_t rows, int64_t dim) {
  apply_rows(x, w, inv_rms, y, rows, dim);
}

void rmsnorm_apply(const float* x, const float* w, const float* inv_rms, uint16_t* y, int64_t rows,
                   int64_t dim) {
  apply_rows(x, w, inv_rms, y, rows, dim);
}

void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* inv_rms, float* dx,
                      float* dw, int64_t rows, int64_t dim) {
  backward_rows(dy, x, w, inv_rms, dx, dw, rows, dim);
}

void rmsnorm_backward(const uint16_t* dy, const float* x, const float* w, const float* inv_rms, float* dx,
                      float* dw, int64_t rows, int64_t dim) {
  backward_rows(dy, x, w, inv_rms, dx, dw, rows, dim);
}

}  // namespace amsp::kernels
