// The cost model: the collectives one optimizer step issues for a shard plan,
// their bytes and times, the compute they can hide behind, and the step time.
//
// The list is the step's schedule (plan/schedule.h) as the cost model sees
// it: the engine issues exactly these collectives, and Stats must account
// exactly these bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/traffic.h"
#include "plan/bandwidth.h"
#include "plan/memory.h"
#include "plan/mesh.h"
#include "plan/schedule.h"

namespace amsp::plan {

// Bytes one node moves for a collective (all its groups of that kind at
// once): through its NICs, and between its own GPUs (NVLink).
struct NodeBytes {
  int64_t nic_sent = 0, nic_received = 0;
  int64_t intra = 0;  // sent by the node's ranks to ranks of the same node
};

// How a training system issues the schedule: amsp's engine (one collective
// per unit and phase, ddp's decoder layers in two buckets, communication
// beside compute) or another system's
// (buckets of a fixed number of elements, overlap on or off).
struct Schedule {
  bool overlap = true;
  int64_t gather_bucket = 0;  // elements per all-gather call; 0 = one per unit
  int64_t reduce_bucket = 0;  // elements per reduce-scatter / all-reduce call; 0 = one per unit
};


struct Collective {
  Phase phase = Phase::kForwardGather;
  int unit = -1;  // unit index, -1 for the gradient norm
  int part = 0;   // the unit's backward part it is issued after (plan/schedule.h: Stage::part)
  comm::Op op = comm::Op::kAllGather;
  GroupKind group = GroupKind::kP;
  int64_t group_size = 1;
  int64_t group_nodes = 1;  // nodes the group spans; > 1 counts as inter-node
  int64_t count = 0;        // traffic_bytes' count (per rank for AG/RS, whole buffer for AR/bcast)
  int64_t elem_bytes = 0;
  int64_t calls = 1;        // calls per occurrence (the paper's broadcasts: one per root)
  int64_t buckets = 1;      // each call split into this many (a bucketed schedule)
  // A later stage of a unit's gradient reduction (G after P; OS and replica
  // after an earlier stage): its communicator starts it when the stage before
  // completes, while compute goes on (plan/schedule.h, Stage::chained).
  bool chained = false;
  int64_t per_step = 1;     // occurrences per step: M for per-micro-batch phases, else 1
  int64_t groups_per_node = 1;  // groups of this kind with members on one node: R / p0
  int64_t switches = 1;     // leaf switches the group's nodes sit under
  // A compressed stage's quantize and dequantize steps (plan/schedule.h): the
  // bytes they read and write in memory per occurrence, timed at the memory
  // bandwidth on the stage's own stream (time_collectives).
  int64_t local_bytes = 0;
  comm::Traffic traffic;    // bytes per rank per occurrence, all calls
  NodeBytes node;           // bytes per node per occurrence, all calls and groups
  double seconds = 0;       // per occurrence, all calls (0 until timed)
  bool inter_node() const { return group_nodes > 1; }
  int64_t ranks_per_node() const { return group_size / group_nodes; }
};

// Micro-batches per rank per step: global_batch_tokens / (seq_len x micro_batch
// x world). Throws UsageError naming --global-batch unless it is an integer >= 1.
int64_t micro_batches_per_step(int64_t global_batch_tokens, const Workload& w, int64_t world);

// The engine's collectives for one step, per unit and phase, untimed; with a
// bucketed schedule each is split into ceil(elements / bucket) calls.
std::vector<Collective> step_collectives(const Workload& w, const ShardPlan& plan,
                                         const MeshShape& mesh, int64_t micro_batches,
                                         const Schedule& schedule = {},
                                         int64_t nodes_per_switch = 0);

// The paper's formulation of the same step (Chen et al., arXiv 2311.00257):
// it shards the optimizer by whole tensors, so each reduce-scatter of c per rank over n becomes an all-reduce of n·c (and a
// local select); each all-gather of c over n becomes n broadcasts of c.
std::vector<Collective> paper_formulation(const std::vector<Collective>& amsp);

// 1 + the expected lateness of the slowest of `ranks` participants, as a
// fraction of the collective: effects.jitter_1024 at 1024 ranks, growing as
// sqrt(ln n) (the maximum of n Gaussians).
double straggler_factor(int64_t ranks, const Effects& effects);

// Fills `seconds` from the table, then adds the spine's oversubscription to
// groups that span leaf switches, the stragglers' delay, and a compressed
// stage's local steps at effects.memory_bytes_per_s (when it is modelled).
void time_collectives(std::vector<Collective>& list, const BandwidthTable& table,
                      const Effects& effects = {});

// Model FLOPs of one forward over one micro-batch, per unit (embed 0; a layer
// 2·(its matmul params) + 2·h·T per token; head 2·V·h per token). Three times
// their sum per token is Llama::flops_per_token.
std::vector<double> unit_forward_flops(const Workload& w);

struct Compute {
  double flops_per_s = 0;  // achievable: peak x fraction, per rank
  double peak_flops_per_s = 0;
};

struct StepCost {
  double compute_s = 0;    // forward + backward (+ recomputation) of every micro-batch
  double comm_s = 0;       // every collective back to back
  double exposed_s = 0;    // communication overlap does not hide, and the slowdown of
                           // compute beside it
  double optimizer_s = 0;  // AdamW and the norm on the OS-shard
  double step_s = 0;       // compute + exposed + optimizer
  double mfu = 0;          // model FLOPs / (step_s x peak), per rank
  double hfu = 0;          // executed FLOPs (with recomputation) / (step_s x peak)
  int64_t sent_intra = 0, sent_inter = 0;        // bytes per rank per step, by group kind
  int64_t received_intra = 0, received_inter = 0;
  NodeBytes node;                                // bytes per node per step
  int64_t nic_bytes() const { return node.nic_sent + node.nic_received; }
};

// Optimizer seconds per step: the bytes AdamW and the norm stream per
// OS-shard element, over the memory bandwidth (0 when it is not modelled).
double optimizer_seconds(const Workload& w, const ShardPlan& plan, const Effects& effects);

// Step time under the overlap model of doc/planner.md: per micro-batch, a
// unit's all-gather hides behind the previous unit's forward (prefetch), the
// next backward gather and the later unit's reductions behind a unit's
// backward, the optimizer gather behind the next step's first forward.
StepCost step_cost(const Workload& w, const std::vector<Collective>& timed, int64_t micro_batches,
                   const Compute& compute, const Schedule& schedule = {},
                   const Effects& effects = {}, double optimizer_s = 0);

}  // namespace amsp::plan
