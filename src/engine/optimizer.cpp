#include "engine/optimizer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/common/math.h"

namespace amsp::engine {

double tensor_weight_decay(const model::TensorSpec& tensor, const AdamWOptions& options) {
  if ((tensor.is_norm || tensor.is_embedding) && !options.decay_norms_and_embeddings) return 0.0;
  return options.weight_decay;
}

void adamw_update_range(const model::UnitSpec& unit, int64_t begin, int64_t end, float* p,
                        const float* g, float* m, float* v, const AdamWOptions& options,
                        double lr, int64_t step) {
  const float bc1 = static_cast<float>(1.0 - std::pow(options.beta1, static_cast<double>(step)));
  const float bc2 = static_cast<float>(1.0 - std::pow(options.beta2, static_cast<double>(step)));
  const float flr = static_cast<float>(lr), b1 = static_cast<float>(options.beta1),
              b2 = static_cast<float>(options.beta2), eps = static_cast<float>(options.eps);
  for (const auto& t : unit.tensors) {
    const int64_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel);
    if (lo >= hi) continue;
    const float wd = static_cast<float>(tensor_weight_decay(t, options));
    const int64_t base = lo - begin, n = hi - lo;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = base; i < base + n; ++i)
      kernels::adamw_update_element(p[i], m[i], v[i], g[i], flr, b1, b2, eps, wd, bc1, bc2);
  }
  // Padding past the last tensor (in sharded buffers) is left untouched.
}

double sum_squares(const float* x, int64_t n) {
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
    double s = 0.0;
    for (int64_t i = lo; i < hi; ++i) s += static_cast<double>(x[i]) * x[i];
    partial[static_cast<size_t>(c)] = s;
  }
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

void scale_inplace(float* x, int64_t n, float s) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

}  // namespace amsp::engine
