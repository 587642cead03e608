// Rotary position embedding in place (kernels/cuda/ops.h): rope_rotate of
// kernels/common/math.h on fp32 or bf16 values (widened, rotated in fp32,
// stored rounded), the same bits as the CPU, four pairs of a head at a time.
#include <type_traits>

#include "kernels/common/math.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pack.cuh"
#include "kernels/cuda/reduce.cuh"

namespace amsp::kernels::cuda {
namespace {

// Rows r of x (position r % T) by blockIdx.y; a row's items, P adjacent pairs
// (i, i + D/2) of one head with their angles' cos and sin, by the threads of x
// (a block takes a row or half of one; 32-bit index arithmetic within a row). Backward is the
// rotation by -angle: sign = -1. V: Sized<P, activation dtype>.
template <typename V>
__global__ void rope_kernel(typename V::Type* x, const float* cos, const float* sin, int64_t rows,
                            int64_t T, int64_t heads, int64_t head_dim, int64_t row_stride,
                            float sign) {
  constexpr int P = V::value;
  // A row's items number heads * D / (2 P): 32-bit index arithmetic.
  const int half = static_cast<int>(head_dim / 2), per_head = half / P,
            items = static_cast<int>(heads) * per_head;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t table = (r % T) * half;
    for (int k = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); k < items;
         k += static_cast<int>(gridDim.x * blockDim.x)) {
      const int i = k % per_head * P;
      typename V::Type* a = x + r * row_stride + static_cast<int64_t>(k / per_head) * head_dim + i;
      const auto lo = load_pack<P>(a), hi = load_pack<P>(a + half);
      const Pack<float, P> c = load_pack<P>(cos + table + i), s = load_pack<P>(sin + table + i);
      float u[P], v[P];
      AMSP_UNROLL
      for (int j = 0; j < P; ++j) {
        u[j] = load(lo.x[j]);
        v[j] = load(hi.x[j]);
        rope_rotate(u[j], v[j], c.x[j], sign * s.x[j]);
      }
      store_pack<P>(a, rounded_pack<typename V::Type>(u));
      store_pack<P>(a + half, rounded_pack<typename V::Type>(v));
    }
  }
}

// Four pairs an item where every head's halves and the tables' rows hold
// whole, aligned packs of 4 (the model's q|k always), else one.
constexpr int kRopePack = 4;

template <typename A>
void rope(A* x, const float* cos, const float* sin, int64_t B, int64_t T, int64_t heads,
          int64_t head_dim, int64_t row_stride, float sign, cudaStream_t s) {
  const int64_t rows = B * T, half = head_dim / 2;
  if (rows * heads * half == 0) return;
  const auto launch = [&](auto pack) {
    using V = Sized<decltype(pack)::value, A>;
    // A block of threads a row, or more for rows of more than twice as many
    // items (llama-7b's q|k: 1024 items, two blocks).
    const dim3 grid(grid_for(heads * half / V::value, 2 * kBlockThreads), grid_for(rows, 1, 65535));
    AMSP_LAUNCH(rope_kernel<V>, grid, kBlockThreads, 0, s)
    (x, cos, sin, rows, T, heads, head_dim, row_stride, sign);
  };
  with_packs<kRopePack>(half % kRopePack == 0 && row_stride % kRopePack == 0, launch, x, cos, sin);
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
