// Cross-entropy over the vocabulary, with ignored targets (< 0), on fp32 or
// bf16 logits (widened on load; the bf16 gradient rounded once on store).
#include <cmath>
#include <type_traits>
#include <vector>

#include "src/core/error.h"
#include "kernels/common/math.h"
#include "kernels/cpu/ops.h"

namespace amsp::kernels {
namespace {

template <typename Z>
double forward_rows(const Z* logits, const int32_t* targets, float* lse, int64_t rows, int64_t V,
                    int64_t* count) {
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] >= V)
      fail("cross-entropy: target ", targets[r], " at row ", r, " is outside the vocabulary of ", V);
  }
  std::vector<double> row_loss(rows);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const Z* z = logits + r * V;
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < V; ++j) mx = load(z[j]) > mx ? load(z[j]) : mx;
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < V; ++j) sum += fast_exp(load(z[j]) - mx);
    const double l = static_cast<double>(mx) + std::log(sum);
    lse[r] = static_cast<float>(l);
    row_loss[r] = targets[r] >= 0 ? l - static_cast<double>(load(z[targets[r]])) : 0.0;
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

// fp32: each entry written, then the target's minus scale. bf16: the target's
// entry computed whole first, so that every entry is rounded once.
template <typename Z>
void backward_rows(Z* logits, const int32_t* targets, const float* lse, int64_t rows, int64_t V,
                   float scale) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    Z* z = logits + r * V;
    const int32_t t = targets[r];
    if (t < 0) {
      for (int64_t j = 0; j < V; ++j) store(z + j, 0.0f);
      continue;
    }
    const float l = lse[r];
    if constexpr (std::is_same_v<Z, float>) {
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) z[j] = scale * fast_exp(z[j] - l);
      z[t] -= scale;
    } else {
      const float zt = load(z[t]);
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) store(z + j, scale * fast_exp(load(z[j]) - l));
      const float p = scale * fast_exp(zt - l);
      store(z + t, p - scale);
    }
  }
}

}  // namespace

double cross_entropy_forward(const float* logits, const int32_t* targets, float* lse, int64_t rows, int64_t V,
                             int64_t* count) {
  return forward_rows(logits, targets, lse, rows, V, count);
}

double cross_entropy_forward(const uint16_t* logits, const int32_t* targets, float* lse, int64_t rows,
                             int64_t V, int64_t* count) {
  return forward_rows(logits, targets, lse, rows, V, count);
}

void cross_entropy_backward(float* logits, const int32_t* targets, const float* lse, int64_t rows, int64_t V,
                            float scale) {
  backward_rows(logits, targets, lse, rows, V, scale);
}

void cross_entropy_backward(uint16_t* logits, const int32_t* targets, const float* lse, int64_t rows,
                            int64_t V, float scale) {
  backward_rows(logits, targets, lse, rows, V, scale);
}

}  // namespace amsp::kernels
