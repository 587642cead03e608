// The mesh of a shard plan: each rank's coordinates and the five groups of a
// plan (P, G, OS, replica, gather; doc/planner.md), as lists of positions. A position is a
// rank's place in node-major order (nodes sorted by switch path, then local
// rank), so consecutive positions share a node and the innermost groups stay
// on the node's fastest links.
//
// Coordinates, P fastest:  p = pos mod s_p
//                          g = (pos / s_p) mod (s_g / s_p)
//                          o = (pos / s_g) mod (s_os / s_g)
//                          r = pos / s_os
// The nesting rules make every group a set of consecutive positions or whole
// nodes, so a group never straddles a node partially.
#pragma once

#include <cstdint>
#include <vector>

#include "plan/shard_plan.h"

namespace amsp::plan {

enum class GroupKind { kP, kG, kOS, kReplica, kGather };
inline constexpr GroupKind kAllGroups[] = {GroupKind::kP, GroupKind::kG, GroupKind::kOS,
                                           GroupKind::kReplica, GroupKind::kGather};
const char* group_name(GroupKind kind);  // "P", "G", "OS", "replica", "gather"

struct Coords {
  int64_t p = 0, g = 0, o = 0, r = 0;
};

class Mesh {
 public:
  Mesh(const ShardPlan& plan, const MeshShape& shape);  // validates the plan

  const ShardPlan& plan() const { return plan_; }
  const MeshShape& shape() const { return shape_; }

  Coords coords(int64_t pos) const;
  int64_t position(const Coords& c) const;

  // Sizes: P s_p, G s_g/s_p, OS s_os/s_g, replica d/s_os, gather s_os/s_p.
  int64_t group_size(GroupKind kind) const;
  // Members of pos's group, ordered by their index inside the group (the
  // index a reduce-scatter hands its piece to).
  std::vector<int64_t> group_members(GroupKind kind, int64_t pos) const;
  // pos's index inside its group.
  int64_t index_in_group(GroupKind kind, int64_t pos) const;
  // Number of distinct nodes a group spans (1: stays inside a node).
  int64_t group_nodes(GroupKind kind) const;

  // Which slice of a unit a rank holds, in units of 1/s_os of the padded unit:
  // its OS-shard is slice os_shard_index; its G-shard covers s_os/s_g slices
  // from g_shard_index * (s_os/s_g); its P-shard s_os/s_p slices from
  // p_shard_index * (s_os/s_p). Nested by construction.
  int64_t p_shard_index(int64_t pos) const;   // in [0, s_p)
  int64_t g_shard_index(int64_t pos) const;   // in [0, s_g)
  int64_t os_shard_index(int64_t pos) const;  // in [0, s_os)

 private:
  ShardPlan plan_;
  MeshShape shape_;
  int64_t sp_, sg_, sos_;
};

}  // namespace amsp::plan
