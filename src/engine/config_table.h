// The configuration table `amsp train` prints on rank 0 before the first step.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "data/mixture.h"
#include "engine/plan_groups.h"
#include "engine/sharded_engine.h"
#include "engine/trainer.h"
#include "topology/topology.h"

namespace amsp::engine {

// Rows of (key, value) as a boxed two-column table, one line each, rules
// included; each column as wide as its widest entry.
std::string format_table(const std::vector<std::pair<std::string, std::string>>& rows);

// The model, ranks, plan, data, schedule and MFU peak of a run, printed to stdout.
void print_config(const TrainOptions& o, const data::Mixture& data, double peak_flops,
                  int threads, const topology::Topology& topo, const PlanGroups& pg,
                  const ShardedEngine& engine, const std::string& backend);

}  // namespace amsp::engine
