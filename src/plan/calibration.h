// Calibration: the cost model against the MFU the AMSP paper (Chen et al.,
// arXiv 2311.00257) measured on its A800 cluster, with one set of cluster
// parameters (inputs/clusters/a800.json). doc/planner.md, "Calibration",
// says how each setting was read from the paper.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "plan/search.h"

namespace amsp::plan {

// The systems the paper measured, as the planner models them.
enum class System {
  kAmsp,           // the planner's plan, amsp's schedule
  kAmspNoOverlap,  // the same plan, communication after compute
  kAmspPaperPlan,  // the plan the paper ran (PublishedPoint::plan), amsp's schedule
  kDeepSpeedZero1, // zero1 with DeepSpeed's buckets (5e8 elements), no overlap (its stage-1 default)
  kDeepSpeedZero3, // zero3 with DeepSpeed's buckets (gathers 5e7, reductions 5e8), no overlap
};
const char* system_name(System system);

// How DeepSpeed runs ZeRO stage 1, 2 or 3 with its default configuration, as
// the calibration models it: buckets of reduce_bucket_size = 5e8 elements
// (stage 3 gathers by stage3_prefetch_bucket_size = 5e7), and communication
// not overlapped (overlap_comm is off by default for stages 1 and 2; for
// stage 3 the paper's own 8-GPU figure says it did not hide, doc/planner.md).
Schedule deepspeed_schedule(int stage);

struct PublishedPoint {
  std::string source;      // where in the paper
  std::string model;       // preset name
  int64_t gpus = 0;
  int64_t micro_batches = 0;  // per rank per step (the paper's M); 0: the 4M-token batch
  bool recompute = false;
  System system = System::kAmsp;
  std::optional<double> mfu;  // published; absent where the paper gives none for the point
  std::string plan{};      // kAmspPaperPlan: the paper's plan, as --shard takes it
};

// Every published figure the calibration compares against, and the plans the
// paper ran at 1024 GPUs (evaluated as given; only 13B's has a figure).
std::vector<PublishedPoint> published_points();

struct CalibrationRow {
  PublishedPoint point;
  Evaluation eval;         // the plan as evaluated for this point
  double predicted = 0;    // MFU as the paper counts it: model FLOPs, not the recomputed forward
  bool fits = false;
};

// Evaluates every published point on `cluster` (GPUs per node, memory, peak,
// table and effects as the cluster gives them).
std::vector<CalibrationRow> calibrate(const Cluster& cluster);

// The input of one point on `cluster`: its GPUs per node, sequence 4096,
// micro-batch 1, bf16, the point's batch and recomputation, and its system's
// schedule (DeepSpeed's buckets; overlap off for kAmspNoOverlap).
PlanInput calibration_input(const PublishedPoint& point, const Cluster& cluster);

}  // namespace amsp::plan
