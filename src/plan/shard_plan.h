// Shard plans: how many ranks share each of the three model states.
//
// Each state X (parameters P, gradients G, optimizer states OS) is sharded over
// s_X = s0 x s1 ranks: s0 ranks inside a node times s1 whole nodes. The rules
// (doc/planner.md, section 1):
//   - s0 divides R (ranks per node), s1 divides N (nodes);
//   - nesting: s0p | s0g | s0os and s1p | s1g | s1os, so OS is never sharded
//     less than G, nor G less than P;
//   - fill the node first: s1 > 1 requires s0 = R.
#pragma once

#include <cstdint>
#include <string>

namespace amsp::plan {

struct Factor {
  int64_t s0 = 1;  // ranks inside a node
  int64_t s1 = 1;  // whole nodes
  int64_t size() const { return s0 * s1; }
  bool operator==(const Factor&) const = default;
};

// "AxB" (ranks per node x nodes), e.g. "8x1".
std::string to_string(const Factor& f);

struct ShardPlan {
  Factor p, g, os;
  std::string name;  // "zero3", "mics:4", "custom", ...
  bool operator==(const ShardPlan& o) const { return p == o.p && g == o.g && os == o.os; }
};

// The cluster shape a plan is laid on.
struct MeshShape {
  int64_t ranks_per_node = 1;  // R
  int64_t nodes = 1;           // N
  int64_t world() const { return ranks_per_node * nodes; }
};

// Turns a data-parallel group size k into a factor that fills nodes first:
// k <= R gives k x 1 (k must divide R), k > R gives R x (k / R) (k a multiple
// of R, k / R dividing N). Throws UsageError naming `what` otherwise.
Factor factor_for_size(int64_t k, const MeshShape& mesh, const std::string& what);

// Parses a plan for a mesh: a name (ddp, zero1, zero2, zero3, fsdp, mics:K)
// or explicit factors "p=4x1,g=4x1,os=8x1" (a bare size, "os=8", is laid out
// node-first; an omitted state takes the previous state's factor: P defaults
// to 1). "auto" is not handled here (the planner resolves it). Throws
// UsageError naming --shard and the rule broken.
ShardPlan parse_shard_plan(const std::string& text, const MeshShape& mesh);

// Throws UsageError with the first rule the plan breaks on this mesh.
void validate(const ShardPlan& plan, const MeshShape& mesh);

// "p=1x1,g=1x1,os=8x1"
std::string to_string(const ShardPlan& plan);

}  // namespace amsp::plan
