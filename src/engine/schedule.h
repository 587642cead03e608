// Learning-rate schedule: linear warmup, then cosine decay to a floor.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace amsp::engine {

struct LrSchedule {
  double lr = 1e-3;           // peak
  double min_lr = 1e-4;       // floor reached at the last step
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
};

// Learning rate for optimizer step `step` (0-based): (step+1)/warmup * lr during
// warmup, so the first update is not zero; then a half cosine from lr down to
// min_lr at the last step.
inline double learning_rate(const LrSchedule& s, int64_t step) {
  if (step < s.warmup_steps) return s.lr * static_cast<double>(step + 1) / s.warmup_steps;
  const int64_t decay_steps = s.total_steps - s.warmup_steps;
  if (decay_steps <= 1) return s.lr;
  const double progress =
      std::clamp(static_cast<double>(step - s.warmup_steps) / (decay_steps - 1), 0.0, 1.0);
  return s.min_lr + 0.5 * (s.lr - s.min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace amsp::engine
