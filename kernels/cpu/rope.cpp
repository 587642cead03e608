// Rotary position embedding, transformers' rotate_half convention.
#include <cmath>

#include "kernels/common/math.h"
#include "kernels/cpu/ops.h"

namespace amsp::kernels {

void rope_table(float* cos, float* sin, int64_t max_T, int64_t head_dim, double theta) {
  const int64_t half = head_dim / 2;
  // As LlamaRotaryEmbedding: inv_freq = 1 / base^(arange(0, D, 2).float() / D)
  // in fp32, freqs = pos.float() * inv_freq in fp32, then cos/sin in fp32
  // (evaluated in double and rounded: torch's fp32 cos/sin are within an ulp).
  const float base = static_cast<float>(theta);
  for (int64_t i = 0; i < half; ++i) {
    const float expo = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    const float inv_freq = 1.0f / std::pow(base, expo);
    for (int64_t p = 0; p < max_T; ++p) {
      const float angle = static_cast<float>(p) * inv_freq;
      cos[p * half + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      sin[p * half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
}

namespace {

// x: fp32, or bf16 (each pair widened, rotated in fp32, stored rounded).
template <typename A>
void rope_apply(A* x, const float* cos, const float* sin, int64_t B, int64_t T, int64_t heads,
                int64_t head_dim, int64_t row_stride, float sign) {
  const int64_t half = head_dim / 2;
  const int64_t rows = B * T;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t pos = r % T;
    const float* c = cos + pos * half;
    const float* s = sin + pos * half;
    for (int64_t h = 0; h < heads; ++h) {
      A* a = x + r * row_stride + h * head_dim;
      A* b = a + half;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        float ai = load(a[i]), bi = load(b[i]);
        rope_rotate(ai, bi, c[i], sign * s[i]);
        store(a + i, ai);
        store(b + i, bi);
      }
    }
  }
}

}  // namespace

void rope_forward(float* x, const float* cos, const float* sin, int64_t B, int64_t T,
                  int64_t heads, int64_t head_dim, int64_t row_stride) {
  rope_apply(x, cos, sin, B, T, heads, head_dim, row_stride, 1.0f);
}

void rope_backward(float* dx, const float* cos, const float* sin, int64_t B, int64_t T,
                   int64_t heads, int64_t head_dim, int64_t row_stride) {
  rope_apply(dx, cos, sin, B, T, heads, head_dim, row_stride, -1.0f);
}

void rope_forward(uint16_t* x, const float* cos, const float* sin, int64_t B, int64_t T,
                  int64_t heads, int64_t head_dim, int64_t row_stride) {
  rope_apply(x, cos, sin, B, T, heads, head_dim, row_stride, 1.0f);
}

void rope_backward(uint16_t* dx, const float* cos, const float* sin, int64_t B, int64_t T,
                   int64_t heads, int64_t head_dim, int64_t row_stride) {
  rope_apply(dx, cos, sin, B, T, heads, head_dim, row_stride, -1.0f);
}

}  // namespace amsp::kernels
