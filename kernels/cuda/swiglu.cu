// SwiGLU of LLaMA's MLP (kernels/cuda/ops.h): one thread per element,
// kernels/common/math.h's swiglu and swiglu_grad, the same bits as the CPU.
#include "kernels/common/math.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace amsp::kernels::cuda {
namespace {

// Element i of the rows x cols output: row i / cols, column i % cols.
__global__ void swiglu_forward_kernel(const float* gate, const float* up, int64_t ld, float* out,
                                      int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t at = i / cols * ld + i % cols;
    out[i] = swiglu(gate[at], up[at]);
  }
}

// dup may alias dout when ld == cols: each thread reads dout[i] before it
// writes dup[i].
__global__ void swiglu_backward_kernel(const float* gate, const float* up, int64_t ld,
                                       const float* dout, float* dgate, float* dup, int64_t rows,
                                       int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t at = i / cols * ld + i % cols;
    float dg, du;
    swiglu_grad(gate[at], up[at], dout[i], dg, du);
    dgate[at] = dg;
    dup[at] = du;
  }
}

}  // namespace

void swiglu_forward(const float* gate, const float* up, int64_t ld, float* out, int64_t rows,
                    int64_t cols, cudaStream_t s) {
  if (rows * cols > 0)
    AMSP_LAUNCH(swiglu_forward_kernel, grid_for(rows * cols), kBlockThreads, 0, s)(
        gate, up, ld, out, rows, cols);
}

void swiglu_backward(const float* gate, const float* up, int64_t ld, const float* dout,
                     float* dgate, float* dup, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows * cols > 0)
    AMSP_LAUNCH(swiglu_backward_kernel, grid_for(rows * cols), kBlockThreads, 0, s)(
        gate, up, ld, dout, dgate, dup, rows, cols);
}

}  // namespace amsp::kernels::cuda
