// SwiGLU activation of LLaMA's MLP: silu(gate) * up.
#include "kernels/common/math.h"
#include "kernels/cpu/ops.h"

namespace amsp::kernels {

void swiglu_forward(const float* gate, const float* up, float* out, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = swiglu(gate[i], up[i]);
}

void swiglu_backward(const float* gate, const float* up, const float* dout, float* dgate,
                     float* dup, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float dg, du;
    swiglu_grad(gate[i], up[i], dout[i], dg, du);
    dgate[i] = dg;
    dup[i] = du;
  }
}

}  // namespace amsp::kernels
