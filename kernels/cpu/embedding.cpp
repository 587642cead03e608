// Token embedding lookup and its deterministic scatter-add backward.
#include <omp.h>

#include <cstring>

#include "kernels/cpu/ops.h"

namespace amsp::kernels {

void embedding_forward(const int32_t* tokens, const float* table, float* out, int64_t rows,
                       int64_t dim) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(out + r * dim, table + static_cast<int64_t>(tokens[r]) * dim, dim * sizeof(float));
}

void embedding_backward(const int32_t* tokens, const float* dout, float* dtable, int64_t rows,
                        int64_t dim) {
  // Each thread owns a contiguous range of columns and adds rows in order: no
  // two threads touch the same element, and every element's sum has a fixed order.
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t c0 = dim * t / nt, c1 = dim * (t + 1) / nt;
    for (int64_t r = 0; r < rows && c1 > c0; ++r) {
      float* dst = dtable + static_cast<int64_t>(tokens[r]) * dim;
      const float* src = dout + r * dim;
#pragma omp simd
      for (int64_t j = c0; j < c1; ++j) dst[j] += src[j];
    }
  }
}

}  // namespace amsp::kernels
