#include "engine/plan_groups.h"

#include <algorithm>

#include "core/mpi_check.h"
#include "core/error.h"

namespace amsp::engine {

comm::Group make_plan_group(MPI_Comm world, const plan::Mesh& mesh, plan::GroupKind kind,
                      const std::vector<int>& ranks_in_order) {
  int me = 0;
  AMSP_MPI_CHECK(MPI_Comm_rank(world, &me));
  const auto it = std::find(ranks_in_order.begin(), ranks_in_order.end(), me);
  if (it == ranks_in_order.end() ||
      static_cast<int64_t>(ranks_in_order.size()) != mesh.shape().world())
    comm::abort_job(cat("group ", plan::group_name(kind), ": the mesh has ", mesh.shape().world(),
                  " positions but the rank order lists ", ranks_in_order.size(), " ranks"));
  const int64_t pos = it - ranks_in_order.begin();
  std::vector<int> members;
  for (int64_t p : mesh.group_members(kind, pos))
    members.push_back(ranks_in_order[static_cast<size_t>(p)]);
  return comm::make_group(world, members, plan::group_name(kind));
}

PlanGroups make_plan_groups(MPI_Comm world, const topology::Topology& topology,
                            const std::string& plan_text) {
  topology.require_equal_tasks_per_node(cat("shard plan ", plan_text));
  const plan::MeshShape shape{topology.local_size, topology.num_nodes};
  const plan::ShardPlan plan = plan::parse_shard_plan(plan_text, shape);
  PlanGroups pg{plan::Mesh(plan, shape), topology.position(), {}, {}, {}};

  const std::vector<int> ranks_in_order = topology.ranks_in_order();
  for (plan::GroupKind kind : plan::kAllGroups)
    pg.groups[static_cast<size_t>(kind)] =
        make_plan_group(world, pg.mesh, kind, ranks_in_order);
  pg.world = comm::dup_group(world, "world");

  // Where the groups sit. A group lies inside a block of consecutive whole
  // nodes in switch order: s1p nodes for P, s1g for G, s1os for OS and gather
  // (the replica group strides across blocks; its traffic is the lightest).
  // The block sits under one leaf switch when the topology has one that big.
  std::string notes;
  for (plan::GroupKind kind : plan::kAllGroups) {
    if (pg.mesh.group_size(kind) <= 1) continue;
    const int64_t nodes = pg.mesh.group_nodes(kind);
    notes += cat(notes.empty() ? "" : ", ", plan::group_name(kind), " ", pg.mesh.group_size(kind),
                 nodes > 1 ? cat(" ranks on ", nodes, " nodes") : " ranks in a node");
    const int64_t block = kind == plan::GroupKind::kP   ? plan.p.s1
                          : kind == plan::GroupKind::kG ? plan.g.s1
                                                        : plan.os.s1;
    if (nodes > 1 && kind != plan::GroupKind::kReplica && topology.has_switch_info() &&
        !topology.groups_under_leaf_switch(static_cast<int>(block)))
      notes += " (across leaf switches: no switch holds that many nodes)";
  }
  pg.placement = notes.empty() ? "no communication groups (one rank)" : notes;
  return pg;
}

}  // namespace amsp::engine
