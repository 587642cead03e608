// AdamW over ranges of a unit's flat buffer. The range form is what sharding
// needs: a rank updates only its optimizer-state shard, which may start and end
// inside tensors; weight decay is applied per tensor (unless asked, none on
// norms and none on the embedding), so the range is split at tensor boundaries.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "model/layout.h"

namespace amsp::engine {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  bool decay_norms_and_embeddings = false;
};

// The global gradient norm's clipping threshold by default (TrainOptions and
// EngineOptions::grad_clip; 0 disables clipping).
inline constexpr double kDefaultGradClip = 1.0;

// Weight decay for one tensor under these options.
double tensor_weight_decay(const model::TensorSpec& tensor, const AdamWOptions& options);

// The OS-shard of one unit, elements [begin, end) of its padded flat buffer:
// master parameters (fp32), gradient (fp32), moments, and where the updated
// parameters are copied in the model's dtype (empty: master is that copy).
struct OsShard {
  int64_t begin = 0, end = 0;
  backend::View master, grad, exp_avg, exp_avg_sq, param_copy;
  // When set (all three), the update is out of place: the states above are
  // read, the updated ones written here (backend::AdamWPart).
  backend::View master_out, exp_avg_out, exp_avg_sq_out;
};

// One AdamW step on the shard; step is the 1-based optimizer step (bias
// correction); scale (fp32 [1] on the backend) multiplies the gradient first
// (clipping).
void adamw_update_range(backend::Backend& be, const model::UnitSpec& unit, const OsShard& shard,
                        const AdamWOptions& options, double lr, int64_t step, const backend::View& scale);

}  // namespace amsp::engine
