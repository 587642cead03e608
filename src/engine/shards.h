// Which part of each unit a rank holds under a shard plan (design note amsp.md,
// section 2). A unit's flat buffer is padded to Φ, a multiple of s_os, so it
// splits evenly at every level (s_p | s_g | s_os); the rank's shards nest:
// its OS-shard lies inside its G-shard, which lies inside its P-shard.
#pragma once

#include <cstdint>
#include <vector>

#include "model/layout.h"
#include "plan/mesh.h"

namespace amsp::engine {

struct Range {
  int64_t begin = 0, size = 0;  // elements of the padded unit
  int64_t end() const { return begin + size; }
};

struct UnitShards {
  int64_t numel = 0;   // the unit's true size
  int64_t padded = 0;  // Φ: numel rounded up to a multiple of s_os
  Range p, g, os;      // this rank's shards
};

// Φ for a unit of `numel` elements under the plan.
int64_t padded_numel(int64_t numel, const plan::ShardPlan& plan);

// The shards of every unit for the rank at node-major position `pos`.
std::vector<UnitShards> unit_shards(const std::vector<model::UnitSpec>& units,
                                    const plan::Mesh& mesh, int64_t pos);

// Bytes of model states a rank allocates: P-shard (params) and G-shard
// (gradient accumulator) at 4 bytes, OS-shard (Adam m and v) at 8 bytes, fp32.
// The planner's memory model for fp32 must give exactly this.
int64_t model_state_bytes(const std::vector<UnitShards>& shards);

}  // namespace amsp::engine
