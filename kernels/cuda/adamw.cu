// Multi-tensor AdamW (kernels/cuda/ops.h): up to kAdamWTensors tensors per
// launch, passed by value in the kernel's parameters (as apex's
// multi_tensor_apply does), so a model's hundreds of small tensors cost a few
// launches instead of hundreds. blockIdx.y picks the tensor, x strides over
// its elements. Per element: the CPU backend's loop, bit for bit.
#include "kernels/common/math.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace amsp::kernels::cuda {
namespace {

struct AdamWBatch {
  AdamWTensor tensors[kAdamWTensors];
};

AMSP_DEVICE_INLINE float load_grad(const AdamWTensor& t, int64_t i) {
  return t.grad_bf16 ? bf16_to_float(static_cast<const bf16*>(t.grad)[i])
                     : static_cast<const float*>(t.grad)[i];
}

AMSP_DEVICE_INLINE void store_copy(const AdamWTensor& t, int64_t i, float p) {
  if (t.copy == nullptr) return;
  if (t.copy_bf16)
    static_cast<bf16*>(t.copy)[i] = float_to_bf16(p);
  else
    static_cast<float*>(t.copy)[i] = p;
}

__global__ void adamw_kernel(AdamWBatch batch, AdamWHyper h) {
  const AdamWTensor& t = batch.tensors[blockIdx.y];
  const float scale = h.scale != nullptr ? *h.scale : h.grad_scale;
  const bool scaled = scale != 1.0f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < t.n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float g = load_grad(t, i);
    if (scaled) g = g * scale;
    float p = t.master_in[i], m = t.m_in[i], v = t.v_in[i];
    adamw_update_element(p, m, v, g, h.lr, h.beta1, h.beta2, h.eps, t.weight_decay,
                         h.bias_correction1, h.bias_correction2);
    t.master[i] = p;
    t.m[i] = m;
    t.v[i] = v;
    store_copy(t, i, p);
  }
}

}  // namespace

void adamw(const AdamWTensor* tensors, int count, const AdamWHyper& hyper, cudaStream_t s) {
  for (int first = 0; first < count; first += kAdamWTensors) {
    AdamWBatch batch{};
    int used = 0;
    int64_t longest = 0;
    for (int k = first; k < count && k < first + kAdamWTensors; ++k) {
      if (tensors[k].n == 0) continue;
      batch.tensors[used++] = tensors[k];
      longest = tensors[k].n > longest ? tensors[k].n : longest;
    }
    if (used == 0) continue;
    const dim3 grid(grid_for(longest, kBlockThreads, 1024), static_cast<unsigned>(used));
    AMSP_LAUNCH(adamw_kernel, grid, kBlockThreads, 0, s)(batch, hyper);
  }
}

}  // namespace amsp::kernels::cuda
