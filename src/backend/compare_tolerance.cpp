#include "backend/compare_tolerance.h"

#include <cmath>

namespace amsp::backend::tolerance {

double gamma(int64_t n) {
  if (n <= 1) return 0;
  const double u = kFp32Roundoff, nd = static_cast<double>(n);
  return std::expm1(kLambda * std::sqrt(nd) * u + nd * u * u / (1 - u));
}

double sum_of(int64_t n) { return 2 * gamma(n); }

double bf16_rounded(double fp32_bound, double rounded_max, double out_max) {
  return kBf16 * rounded_max / (out_max > 0 ? out_max : 1) + fp32_bound;
}

}  // namespace amsp::backend::tolerance
