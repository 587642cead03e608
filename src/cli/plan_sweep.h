// amsp plan --sweep: the named systems of the scaling literature (ZeRO-1/2/3,
// MiCS, FSDP hybrid sharding) and the planner's own choice, evaluated by the
// planner's cost model at a list of GPU counts, as one table, JSON or a plot.
// Kept apart from plan_cmd.cpp: it uses only the public planner API
// (plan::evaluate, plan::search, parse_shard_plan), whatever the cost model is.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "plan/search.h"

namespace amsp::cli {

// "8,16,32": GPU counts, totals over all nodes, strictly increasing. Throws
// UsageError naming --sweep on an empty list or anything but whole numbers >= 1.
std::vector<int64_t> parse_sweep_list(const std::string& text);

// The list parses, every count is a whole number of nodes of
// `gpus_per_node`, and a fixed global batch (> 0: --global-batch was given) is
// a whole number of micro-batches of `tokens_per_micro_batch` per rank at
// every scale. Throws UsageError naming the scale that breaks it.
void check_sweep(const std::string& list, int64_t gpus_per_node, int64_t global_batch_tokens,
                 int64_t tokens_per_micro_batch);

struct SweepRequest {
  plan::PlanInput base;        // everything but the mesh's nodes (and the batch, unless fixed)
  plan::Cluster cluster;       // for the title and the notes
  std::string measured_table;  // --bandwidth FILE; empty: the cluster's own table
  std::string list;            // --sweep
  bool fixed_batch = false;    // --global-batch given: base.global_batch_tokens at every scale
  std::string plot;            // --plot FILE.png; empty: no plot
  bool json = false;
};

// Evaluates every system at every scale and prints the table (or JSON); writes
// the plot last. Returns the exit code.
int run_sweep(std::ostream& os, const SweepRequest& request);

}  // namespace amsp::cli
