// SwiGLU of LLaMA's MLP (kernels/cuda/ops.h): one thread per element,
// kernels/common/math.h's swiglu and swiglu_grad on fp32 or bf16 activations
// (widened, computed in fp32, stored rounded), the same bits as the CPU.
#include "kernels/common/math.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace amsp::kernels::cuda {
namespace {

// Element i of the rows x cols output: row i / cols, column i % cols.
template <typename A>
__global__ void swiglu_forward_kernel(const A* gate, const A* up, int64_t ld, A* out, int64_t rows,
                                      int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t at = i / cols * ld + i % cols;
    store(out + i, swiglu(load(gate[at]), load(up[at])));
  }
}

// dup may alias dout when ld == cols: each thread reads dout[i] before it
// writes dup[i].
template <typename A>
__global__ void swiglu_backward_kernel(const A* gate, const A* up, int64_t ld, const A* dout, A* dgate,
                                       A* dup, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t at = i / cols * ld + i % cols;
    float dg, du;
    swiglu_grad(load(gate[at]), load(up[at]), load(dout[i]), dg, du);
    store(dgate + at, dg);
    store(dup + at, du);
  }
}

}  // namespace

template <typename A>
void swiglu_forward(const A* gate, const A* up, int64_t ld, A* out, int64_t rows, int64_t cols,
                    cudaStream_t s) {
  if (rows * cols > 0)
    AMSP_LAUNCH(swiglu_forward_kernel<A>, grid_for(rows * cols), kBlockThreads, 0, s)(
        gate, up, ld, out, rows, cols);
}

template <typename A>
void swiglu_backward(const A* gate, const A* up, int64_t ld, const A* dout, A* dgate, A* dup,
                     int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows * cols > 0)
    AMSP_LAUNCH(swiglu_backward_kernel<A>, grid_for(rows * cols), kBlockThreads, 0, s)(
        gate, up, ld, dout, dgate, dup, rows, cols);
}

template void swiglu_forward(const float*, const float*, int64_t, float*, int64_t, int64_t, cudaStream_t);
template void swiglu_forward(const bf16*, const bf16*, int64_t, bf16*, int64_t, int64_t, cudaStream_t);
template void swiglu_backward(const float*, const float*, int64_t, const float*, float*, float*, int64_t,
                              int64_t, cudaStream_t);
template void swiglu_backward(const bf16*, const bf16*, int64_t, const bf16*, bf16*, bf16*, int64_t,
                              int64_t, cudaStream_t);

}  // namespace amsp::kernels::cuda
