// Rotary position embedding in place (kernels/cuda/ops.h): one thread per
// rotated pair, rope_rotate of kernels/common/math.h on fp32 or bf16 values
// (widened, rotated in fp32, stored rounded), the same bits as the CPU.
#include "kernels/common/math.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace amsp::kernels::cuda {
namespace {

// Pair i of head h of row r, i < head_dim / 2; position = r % T. Backward is
// the rotation by -angle: sign = -1.
template <typename A>
__global__ void rope_kernel(A* x, const float* cos, const float* sin, int64_t T, int64_t heads,
                            int64_t head_dim, int64_t row_stride, int64_t pairs, float sign) {
  const int64_t half = head_dim / 2;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < pairs;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = k % half, h = k / half % heads, r = k / (half * heads);
    const int64_t table = (r % T) * half + i;
    A* a = x + r * row_stride + h * head_dim + i;
    float lo = load(a[0]), hi = load(a[half]);
    rope_rotate(lo, hi, cos[table], sign * sin[table]);
    store(a, lo);
    store(a + half, hi);
  }
}

template <typename A>
void rope(A* x, const float* cos, const float* sin, int64_t B, int64_t T, int64_t heads,
          int64_t head_dim, int64_t row_stride, float sign, cudaStream_t s) {
  const int64_t pairs = B * T * heads * (head_dim / 2);
  if (pairs > 0)
    AMSP_LAUNCH(rope_kernel<A>, grid_for(pairs), kBlockThreads, 0, s)(
        x, cos, sin, T, heads, head_dim, row_stride, pairs, sign);
}

}  // namespace

template <typename A>
void rope_forward(A* x, const float* cos, const float* sin, int64_t B, int64_t T, int64_t heads,
                  int64_t head_dim, int64_t row_stride, cudaStream_t s) {
  rope(x, cos, sin, B, T, heads, head_dim, row_stride, 1.0f, s);
}

template <typename A>
void rope_backward(A* dx, const float* cos, const float* sin, int64_t B, int64_t T, int64_t heads,
                   int64_t head_dim, int64_t row_stride, cudaStream_t s) {
  rope(dx, cos, sin, B, T, heads, head_dim, row_stride, -1.0f, s);
}

#define AMSP_ROPE(A)                                                                              \
  template void rope_forward(A*, const float*, const float*, int64_t, int64_t, int64_t, int64_t,  \
                             int64_t, cudaStream_t);                                              \
  template void rope_backward(A*, const float*, const float*, int64_t, int64_t, int64_t, int64_t, \
                              int64_t, cudaStream_t);
AMSP_ROPE(float)
AMSP_ROPE(bf16)
#undef AMSP_ROPE

}  // namespace amsp::kernels::cuda
