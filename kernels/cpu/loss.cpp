// Cross-entropy over the vocabulary, with ignored targets (< 0).
#include <cmath>
#include <vector>

#include "src/core/error.h"
#include "kernels/common/math.h"
#include "kernels/cpu/ops.h"

namespace amsp::kernels {

double cross_entropy_forward(const float* logits, const int32_t* targets, float* lse,
                             int64_t rows, int64_t V, int64_t* count) {
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] >= V)
      fail("cross-entropy: target ", targets[r], " at row ", r, " is outside the vocabulary of ", V);
  }
  std::vector<double> row_loss(rows);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits + r * V;
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < V; ++j) mx = z[j] > mx ? z[j] : mx;
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < V; ++j) sum += fast_exp(z[j] - mx);
    const double l = static_cast<double>(mx) + std::log(sum);
    lse[r] = static_cast<float>(l);
    row_loss[r] = targets[r] >= 0 ? l - static_cast<double>(z[targets[r]]) : 0.0;
  }
  double total = 0.0;
  int64_t n = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] < 0) continue;
    total += row_loss[r];
    ++n;
  }
  *count = n;
  return total;
}

void cross_entropy_backward(float* logits, const int32_t* targets, const float* lse,
                            int64_t rows, int64_t V, float scale) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* z = logits + r * V;
    if (targets[r] < 0) {
      for (int64_t j = 0; j < V; ++j) z[j] = 0.0f;
      continue;
    }
    const float l = lse[r];
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) z[j] = scale * fast_exp(z[j] - l);
    z[targets[r]] -= scale;
  }
}

}  // namespace amsp::kernels
