#include "engine/optimizer.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace amsp::engine {

double tensor_weight_decay(const model::TensorSpec& tensor, const AdamWOptions& options) {
  if ((tensor.is_norm || tensor.is_embedding) && !options.decay_norms_and_embeddings) return 0.0;
  return options.weight_decay;
}

void adamw_update_range(backend::Backend& be, const model::UnitSpec& unit, const OsShard& s,
                        const AdamWOptions& options, double lr, int64_t step, const backend::View& scale) {
  backend::AdamWStep a;
  a.lr = static_cast<float>(lr);
  a.beta1 = static_cast<float>(options.beta1);
  a.beta2 = static_cast<float>(options.beta2);
  a.eps = static_cast<float>(options.eps);
  a.bias_correction1 = static_cast<float>(1.0 - std::pow(options.beta1, static_cast<double>(step)));
  a.bias_correction2 = static_cast<float>(1.0 - std::pow(options.beta2, static_cast<double>(step)));
  a.scale = scale;
  // The slice of every tensor inside the shard, each with its own decay, in one call.
  std::vector<backend::AdamWPart> parts;
  for (const auto& t : unit.tensors) {
    const int64_t lo = std::max(s.begin, t.offset), hi = std::min(s.end, t.offset + t.numel);
    if (lo >= hi) continue;
    const int64_t at = lo - s.begin, n = hi - lo;
    auto slice = [&](const backend::View& v) { return v.empty() ? backend::View{} : v.at(at, n); };
    parts.push_back({s.master.at(at, n), s.exp_avg.at(at, n), s.exp_avg_sq.at(at, n), s.grad.at(at, n),
                     slice(s.param_copy), static_cast<float>(tensor_weight_decay(t, options)),
                     slice(s.master_out), slice(s.exp_avg_out), slice(s.exp_avg_sq_out)});
  }
  be.adamw_parts(parts, a);
  // Padding past the last tensor (in sharded buffers) is left untouched.
}

}  // namespace amsp::engine
