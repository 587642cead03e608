// The cost model: the collectives one optimizer step issues for a shard plan,
// their bytes and times, the compute they can hide behind, and the step time.
//
// The list is the contract with the sharding engine (doc/planner.md, "The
// schedule"): the engine issues exactly these collectives, and Stats must
// account exactly these bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/traffic.h"
#include "plan/bandwidth.h"
#include "plan/memory.h"
#include "plan/mesh.h"

namespace amsp::plan {

enum class Phase {
  kForwardGather,    // every micro-batch: P all-gather before a unit's forward
  kBackwardGather,   // every micro-batch: P all-gather again before backward (not the head)
  kBackwardReduce,   // every micro-batch: P reduce-scatter, then G reduce-scatter
  kLastReduce,       // last micro-batch: OS reduce-scatter, replica all-reduce
  kGradNorm,         // once: all-reduce of the squared norm (fp64) over the world
  kOptimizerGather,  // once, after AdamW: gather-group all-gather of the OS-shards
};
const char* phase_name(Phase phase);

struct Collective {
  Phase phase = Phase::kForwardGather;
  int unit = -1;  // unit index, -1 for the gradient norm
  comm::Op op = comm::Op::kAllGather;
  GroupKind group = GroupKind::kP;
  int64_t group_size = 1;
  int64_t group_nodes = 1;  // nodes the group spans; > 1 counts as inter-node
  int64_t count = 0;        // traffic_bytes' count (per rank for AG/RS, whole buffer for AR/bcast)
  int64_t elem_bytes = 0;
  int64_t calls = 1;        // calls per occurrence (the paper's broadcasts: one per root)
  int64_t per_step = 1;     // occurrences per step: M for per-micro-batch phases, else 1
  comm::Traffic traffic;    // bytes per rank per occurrence, all calls
  double seconds = 0;       // per occurrence, all calls (0 until timed)
  bool inter_node() const { return group_nodes > 1; }
  int64_t ranks_per_node() const { return group_size / group_nodes; }
};

// Micro-batches per rank per step: global_batch_tokens / (seq_len x micro_batch
// x world). Throws UsageError naming --global-batch unless it is an integer >= 1.
int64_t micro_batches_per_step(int64_t global_batch_tokens, const Workload& w, int64_t world);

// The engine's collectives for one step, per unit and phase, untimed.
std::vector<Collective> step_collectives(const Workload& w, const ShardPlan& plan,
                                         const MeshShape& mesh, int64_t micro_batches);

// The paper's formulation of the same step (Chen et al., arXiv 2311.00257):
// it shards the optimizer by whole tensors, so each reduce-scatter of c per rank over n becomes an all-reduce of n·c (and a
// local select); each all-gather of c over n becomes n broadcasts of c.
std::vector<Collective> paper_formulation(const std::vector<Collective>& amsp);

// Fills `seconds` from the table.
void time_collectives(std::vector<Collective>& list, const BandwidthTable& table);

// Model FLOPs of one forward over one micro-batch, per unit (embed 0; a layer
// 2·(its matmul params) + 2·h·T per token; head 2·V·h per token). Three times
// their sum per token is Llama::flops_per_token.
std::vector<double> unit_forward_flops(const Workload& w);

struct Compute {
  double flops_per_s = 0;  // achievable: peak x fraction, per rank
  double peak_flops_per_s = 0;
};

struct StepCost {
  double compute_s = 0;   // forward + backward (+ recomputation) of every micro-batch
  double comm_s = 0;      // every collective back to back
  double exposed_s = 0;   // communication overlap does not hide
  double step_s = 0;      // compute + exposed
  double mfu = 0;         // model FLOPs / (step_s x peak), per rank
  int64_t sent_intra = 0, sent_inter = 0;        // bytes per rank per step
  int64_t received_intra = 0, received_inter = 0;
};

// Step time under the overlap model of doc/planner.md: per micro-batch, a
// unit's all-gather hides behind the previous unit's forward (prefetch), the
// next backward gather and the later unit's reductions behind a unit's
// backward, the optimizer gather behind the next step's first forward.
StepCost step_cost(const Workload& w, const std::vector<Collective>& timed, int64_t micro_batches,
                   const Compute& compute);

}  // namespace amsp::plan
