// The planner: evaluate shard plans (memory, collectives, step time) and
// search every valid plan for the fastest one that fits. `amsp plan` prints
// it; `amsp train --shard auto` calls choose_plan on the live topology.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "plan/bandwidth.h"
#include "plan/cost.h"
#include "plan/memory.h"
#include "plan/shard_plan.h"

namespace amsp::plan {

inline constexpr double kMemoryMargin = 0.08;

struct PlanInput {
  Workload workload;
  MeshShape mesh;
  int64_t global_batch_tokens = 0;  // tokens per optimizer step, all ranks
  int64_t memory_per_rank = 0;      // bytes of a GPU (or a rank's share of host memory)
  // The fraction of memory_per_rank a plan may not use: the CUDA context, NCCL's
  // buffers and the allocator's fragmentation, which memory_per_rank does not count.
  double memory_margin = kMemoryMargin;
  BandwidthTable bandwidth;
  Compute compute;
  Schedule schedule;
  Effects effects;
  // With workload.compression "auto": each plan is evaluated uncompressed and
  // with each of compression_candidates(), and ranked as any other choice.
  int64_t usable_memory() const;
};

// Fills bandwidth and compute from a cluster (peak for the workload's precision).
void use_cluster(PlanInput& in, const Cluster& cluster);

struct Evaluation {
  ShardPlan plan;
  Compression compression;  // what it was evaluated with (the choice, under auto)
  MemoryBreakdown memory;
  std::vector<Collective> collectives;  // timed
  StepCost cost;
  bool fits = false;
};

// Every plan the rules of shard_plan.h allow on the mesh (named "custom").
std::vector<ShardPlan> enumerate_plans(const MeshShape& mesh);

// One plan, fully costed. Throws UsageError on a bad --global-batch.
Evaluation evaluate(const PlanInput& in, const ShardPlan& plan);

// The same plan in the paper's formulation (cost.h, paper_formulation):
// all-reduce and select for gradients, broadcasts for parameters.
Evaluation evaluate_paper(const PlanInput& in, const Evaluation& amsp);

// Ranking, the AMSP objective: among plans that fit, least exposed
// communication; then fewest bytes through a node's NICs (sent + received);
// then least memory; then intra-node bytes, step time and the factors (so the
// order is total and deterministic). Exposed times that differ by less than
// kTieResolution of the compute time (identical for all plans of one input)
// are ties: the model cannot resolve them.
inline constexpr double kTieResolution = 1e-3;
bool better(const Evaluation& a, const Evaluation& b);
// floor(exposed / (kTieResolution x compute)): the first ranking key.
double exposed_ticks(const Evaluation& e);

// Every valid plan, evaluated: the ones that fit first, ranked best first,
// then those that do not fit, by memory.
std::vector<Evaluation> search(const PlanInput& in);

// The best plan that fits; throws UsageError saying how much the smallest
// plan needs when none does.
Evaluation choose_plan(const PlanInput& in);

// Named plans shown beside the search: ddp, zero1, zero2, zero3, and mics:K
// for K = one node, two and four nodes.
std::vector<std::string> named_plan_names(const MeshShape& mesh);

struct NamedResult {
  std::string name;
  std::optional<Evaluation> eval;  // absent when the plan is invalid on the mesh
  std::string excluded;            // empty when it fits
  int rank = 0;                    // 1-based place among fitting plans, 0 if excluded
};
std::vector<NamedResult> named_results(const PlanInput& in, const std::vector<Evaluation>& ranked);

// One line on why `winner` ranks above `runner_up`: the first ranking key
// that tells them apart, with both values.
std::string why_better(const Evaluation& winner, const Evaluation& runner_up);

// Tokens: "4194304", "4M" (= 4·2^20, as LLM papers count batch tokens), "4Mi",
// "512K", "1G". Throws UsageError naming `option`.
int64_t parse_token_count(const std::string& text, const std::string& option);

}  // namespace amsp::plan
