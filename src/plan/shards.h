// Which part of each unit a rank holds under a shard plan (doc/engine.md, "What a
// rank holds"). A unit's flat buffer is padded to Φ, a multiple of s_os, so it
// splits evenly at every level (s_p | s_g | s_os); the rank's shards nest:
// its OS-shard lies inside its G-shard, which lies inside its P-shard.
#pragma once

#include <cstdint>
#include <vector>

#include "model/layout.h"
#include "plan/memory.h"
#include "plan/mesh.h"

namespace amsp::plan {

struct Range {
  int64_t begin = 0, size = 0;  // elements of the padded unit
  int64_t end() const { return begin + size; }
};

struct UnitShards {
  int64_t numel = 0;   // the unit's true size
  int64_t padded = 0;  // Φ: numel rounded up to a multiple of s_os
  Range p, g, os;      // this rank's shards
};

// The shards of every unit for the rank at node-major position `pos`.
std::vector<UnitShards> unit_shards(const std::vector<model::UnitSpec>& units,
                                    const Mesh& mesh, int64_t pos);

// Bytes of model states a rank holds at `bytes` per element of each state
// (state_bytes(precision): P-shard parameters, G-shard gradient accumulator,
// OS-shard optimizer states). The planner's memory model gives exactly this,
// and the engine allocates exactly this.
int64_t model_state_bytes(const std::vector<UnitShards>& shards, const StateBytes& bytes);

}  // namespace amsp::plan
