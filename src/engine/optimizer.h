// AdamW over ranges of a unit's flat buffer. The range form is what sharding
// needs: a rank updates only its optimizer-state shard, which may start and end
// inside tensors; weight decay is applied per tensor (none on norms and, unless
// asked, none on the embedding), so the range is split at tensor boundaries.
#pragma once

#include <cstdint>

#include "model/layout.h"

namespace amsp::engine {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  bool decay_norms_and_embeddings = false;
};

// Weight decay for one tensor under these options.
double tensor_weight_decay(const model::TensorSpec& tensor, const AdamWOptions& options);

// Updates elements [begin, end) of `unit`'s flat buffer. p, g, m, v point at
// element `begin`. step is the 1-based optimizer step (for bias correction).
void adamw_update_range(const model::UnitSpec& unit, int64_t begin, int64_t end, float* p,
                        const float* g, float* m, float* v, const AdamWOptions& options,
                        double lr, int64_t step);

// Sum of squares of n floats, in double, in a fixed order whatever the thread
// count, so gradient norms are bit-reproducible.
double sum_squares(const float* x, int64_t n);

// x *= s over n floats.
void scale_inplace(float* x, int64_t n, float s);

}  // namespace amsp::engine
