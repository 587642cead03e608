// AdamW over a flat buffer.
#include <cmath>

#include "kernels/common/math.h"
#include "kernels/cpu/ops.h"

namespace amsp::kernels {

void adamw_update(float* params, float* m, float* v, const float* grads, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step) {
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), step));
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), step));
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i)
    adamw_update_element(params[i], m[i], v[i], grads[i], lr, beta1, beta2, eps, weight_decay, bc1,
                         bc2);
}

}  // namespace amsp::kernels
