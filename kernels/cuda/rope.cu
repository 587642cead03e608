// Rotary position embedding in place (kernels/cuda/ops.h): one thread per
// rotated pair, rope_rotate of kernels/common/math.h, the same bits as the CPU.
#include "kernels/common/math.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace amsp::kernels::cuda {
namespace {

// Pair i of head h of row r, i < head_dim / 2; position = r % T. Backward is
// the rotation by -angle: sign = -1.
__global__ void rope_kernel(float* x, const float* cos, const float* sin, int64_t T, int64_t heads,
                            int64_t head_dim, int64_t row_stride, int64_t pairs, float sign) {
  const int64_t half = head_dim / 2;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < pairs;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = k % half, h = k / half % heads, r = k / (half * heads);
    const int64_t table = (r % T) * half + i;
    float* a = x + r * row_stride + h * head_dim + i;
    rope_rotate(a[0], a[half], cos[table], sign * sin[table]);
  }
}

void rope(float* x, const float* cos, const float* sin, int64_t B, int64_t T, int64_t heads,
          int64_t head_dim, int64_t row_stride, float sign, cudaStream_t s) {
  const int64_t pairs = B * T * heads * (head_dim / 2);
  if (pairs > 0)
    AMSP_LAUNCH(rope_kernel, grid_for(pairs), kBlockThreads, 0, s)(
        x, cos, sin, T, heads, head_dim, row_stride, pairs, sign);
}

}  // namespace

void rope_forward(float* x, const float* cos, const float* sin, int64_t B, int64_t T,
                  int64_t heads, int64_t head_dim, int64_t row_stride, cudaStream_t s) {
  rope(x, cos, sin, B, T, heads, head_dim, row_stride, 1.0f, s);
}

void rope_backward(float* dx, const float* cos, const float* sin, int64_t B, int64_t T,
                   int64_t heads, int64_t head_dim, int64_t row_stride, cudaStream_t s) {
  rope(dx, cos, sin, B, T, heads, head_dim, row_stride, -1.0f, s);
}

}  // namespace amsp::kernels::cuda
