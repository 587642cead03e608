// SwiGLU of LLaMA's MLP (kernels/cuda/ops.h): one thread per element,
// kernels/common/math.h's swiglu and swiglu_grad, the same bits as the CPU.
#include "kernels/common/math.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace amsp::kernels::cuda {
namespace {

__global__ void swiglu_forward_kernel(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = swiglu(gate[i], up[i]);
}

// dup may alias dout: each thread reads dout[i] before it writes dup[i].
__global__ void swiglu_backward_kernel(const float* gate, const float* up, const float* dout,
                                       float* dgate, float* dup, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float dg, du;
    swiglu_grad(gate[i], up[i], dout[i], dg, du);
    dgate[i] = dg;
    dup[i] = du;
  }
}

}  // namespace

void swiglu_forward(const float* gate, const float* up, float* out, int64_t n, cudaStream_t s) {
  if (n > 0)
    AMSP_LAUNCH(swiglu_forward_kernel, grid_for(n), kBlockThreads, 0, s)(gate, up, out, n);
}

void swiglu_backward(const float* gate, const float* up, const float* dout, float* dgate,
                     float* dup, int64_t n, cudaStream_t s) {
  if (n > 0)
    AMSP_LAUNCH(swiglu_backward_kernel, grid_for(n), kBlockThreads, 0, s)(
        gate, up, dout, dgate, dup, n);
}

}  // namespace amsp::kernels::cuda
