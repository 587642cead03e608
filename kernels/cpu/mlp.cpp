// SwiGLU activation of LLaMA's MLP: silu(gate) * up, on fp32 or bf16
// activations (each element widened, computed in fp32, stored rounded).
#include "kernels/common/math.h"
#include "kernels/cpu/ops.h"

namespace amsp::kernels {
namespace {

template <typename A>
void swiglu_forward_rows(const A* gate, const A* up, int64_t ld, A* out, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const A* g = gate + r * ld;
    const A* u = up + r * ld;
    A* o = out + r * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) store(o + c, swiglu(load(g[c]), load(u[c])));
  }
}

template <typename A>
void swiglu_backward_rows(const A* gate, const A* up, int64_t ld, const A* dout, A* dgate, A* dup,
                          int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const A* g = gate + r * ld;
    const A* u = up + r * ld;
    const A* d = dout + r * cols;
    A* dg = dgate + r * ld;
    A* du = dup + r * ld;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) {
      float a, b;
      swiglu_grad(load(g[c]), load(u[c]), load(d[c]), a, b);
      store(dg + c, a);
      store(du + c, b);
    }
  }
}

}  // namespace

void swiglu_forward(const float* gate, const float* up, int64_t ld, float* out, int64_t rows,
                    int64_t cols) {
  swiglu_forward_rows(gate, up, ld, out, rows, cols);
}

void swiglu_forward(const uint16_t* gate, const uint16_t* up, int64_t ld, uint16_t* out, int64_t rows,
                    int64_t cols) {
  swiglu_forward_rows(gate, up, ld, out, rows, cols);
}

void swiglu_backward(const float* gate, const float* up, int64_t ld, const float* dout,
                     float* dgate, float* dup, int64_t rows, int64_t cols) {
  swiglu_backward_rows(gate, up, ld, dout, dgate, dup, rows, cols);
}

void swiglu_backward(const uint16_t* gate, const uint16_t* up, int64_t ld, const uint16_t* dout,
                     uint16_t* dgate, uint16_t* dup, int64_t rows, int64_t cols) {
  swiglu_backward_rows(gate, up, ld, dout, dgate, dup, rows, cols);
}

}  // namespace amsp::kernels
