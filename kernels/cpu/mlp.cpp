// SwiGLU activation of LLaMA's MLP: silu(gate) * up.
#include "kernels/common/math.h"
#include "kernels/cpu/ops.h"

namespace amsp::kernels {

void swiglu_forward(const float* gate, const float* up, int64_t ld, float* out, int64_t rows,
                    int64_t cols) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate + r * ld;
    const float* u = up + r * ld;
    float* o = out + r * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) o[c] = swiglu(g[c], u[c]);
  }
}

void swiglu_backward(const float* gate, const float* up, int64_t ld, const float* dout,
                     float* dgate, float* dup, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate + r * ld;
    const float* u = up + r * ld;
    const float* d = dout + r * cols;
    float* dg = dgate + r * ld;
    float* du = dup + r * ld;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) {
      float a, b;
      swiglu_grad(g[c], u[c], d[c], a, b);
      dg[c] = a;
      du[c] = b;
    }
  }
}

}  // namespace amsp::kernels
