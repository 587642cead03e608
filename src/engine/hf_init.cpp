#include "engine/hf_init.h"

#include "ckpt/selection.h"

namespace amsp::engine {

void load_hf_weights(const hf::ModelDir& dir, ShardedEngine& engine) {
  const auto& units = engine.units();
  dir.check(units);
  const auto views = engine.state_views();
  for (size_t u = 0; u < units.size(); ++u) {
    const Range p = engine.shards()[u].p;
    for (const auto& t : units[u].tensors) {
      const auto piece = ckpt::intersect(t, p.begin, p.end());
      if (piece) dir.read(t.name, piece->begin, piece->size(), views[u].params + piece->buffer_offset);
    }
  }
}

}  // namespace amsp::engine
