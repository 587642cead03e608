// Initial parameters from a Hugging Face model directory (--init-from): each
// rank reads only the elements of its P-shard, straight from the safetensors
// files, whatever the plan and the number of ranks.
#pragma once

#include "hf/model_dir.h"
#include "engine/sharded_engine.h"

namespace amsp::engine {

// Overwrites this rank's P-shard parameters with the directory's weights.
// Throws UsageError if a tensor is missing, misshapen or unexpected
// (ModelDir::check). Adam moments are left as they are (zero at start).
void load_hf_weights(const hf::ModelDir& dir, ShardedEngine& engine);

}  // namespace amsp::engine
