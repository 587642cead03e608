#include "engine/plan_groups.h"

#include <algorithm>
#include <map>

#include "core/mpi_check.h"
#include "core/error.h"

namespace amsp::engine {
namespace {

using topology::Topology;

// The node index at every node-major position.
std::vector<int> nodes_by_position(const Topology& t) {
  std::vector<int> out;
  for (int r : t.ranks_in_order()) out.push_back(t.rank_node[static_cast<size_t>(r)]);
  return out;
}

// The most nodes of the allocation under one leaf switch.
int most_allocated_under_one_switch(const Topology& t) {
  std::map<std::string, int> count;
  int most = 0;
  for (const topology::NodeInfo& n : t.nodes) most = std::max(most, ++count[n.switch_path()]);
  return most;
}

// Why groups of k nodes cross leaf switches; `example` names two nodes of one.
std::string crossing_cause(const Topology& t, int64_t k, const std::string& example) {
  int biggest = 0;
  for (const auto& [name, nodes] : t.switch_nodes) biggest = std::max(biggest, nodes);
  if (!t.switch_nodes.empty() && biggest < k) return cat("plan size, no switch holds ", k, " nodes");
  const int most = most_allocated_under_one_switch(t);
  if (most < k) return cat("allocation, at most ", most, " of its nodes under one switch");
  return cat("block alignment, ", example, " in one group");
}

// Whether every group of `kind` stays under one leaf switch, and if not, why.
std::string switch_note(const plan::Mesh& mesh, plan::GroupKind kind, const Topology& t,
                        const std::vector<int>& node_at) {
  auto node = [&](int64_t pos) -> const topology::NodeInfo& {
    return t.nodes[static_cast<size_t>(node_at[static_cast<size_t>(pos)])];
  };
  int64_t groups = 0, across = 0;
  std::string example;
  for (int64_t pos = 0; pos < mesh.shape().world(); ++pos) {
    if (mesh.index_in_group(kind, pos) != 0) continue;  // each group once, by its first member
    ++groups;
    for (int64_t m : mesh.group_members(kind, pos)) {
      if (node(m).switches == node(pos).switches) continue;
      if (++across == 1)
        example = cat(node(pos).name, " (", node(pos).leaf_switch(), ") and ", node(m).name, " (",
                      node(m).leaf_switch(), ")");
      break;
    }
  }
  if (across == 0) return "under one leaf switch";
  return cat(across < groups ? cat(across, " of ", groups, " groups ") : "", "across leaf switches: ",
             crossing_cause(t, mesh.group_nodes(kind), example));
}

}  // namespace

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

std::string placement_notes(const plan::Mesh& mesh, const Topology& topology) {
  const std::vector<int> node_at = nodes_by_position(topology);
  std::string notes;
  for (plan::GroupKind kind : plan::kAllGroups) {
    if (mesh.group_size(kind) <= 1) continue;
    const int64_t nodes = mesh.group_nodes(kind);
    notes += cat(notes.empty() ? "" : "; ", plan::group_name(kind), " ", mesh.group_size(kind),
                 nodes > 1 ? cat(" ranks on ", nodes, " nodes") : " ranks in a node");
    if (nodes > 1 && topology.has_switch_info())
      notes += " (" + switch_note(mesh, kind, topology, node_at) + ")";
  }
  return notes.empty() ? "no communication groups (one rank)" : notes;
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

  pg.placement = placement_notes(pg.mesh, topology);
  return pg;
}

}  // namespace amsp::engine
