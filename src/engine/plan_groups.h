// A shard plan laid on the live job: the mesh from the discovered topology and
// the five groups of the plan (P, G, OS, replica, gather) as communicators.
#pragma once

#include <mpi.h>

#include <array>
#include <string>

#include "comm/group.h"
#include "plan/mesh.h"
#include "topology/topology.h"

namespace amsp::engine {

struct PlanGroups {
  plan::Mesh mesh;
  int64_t position = 0;                  // this rank's node-major position
  std::array<comm::Group, 5> groups;     // indexed by plan::GroupKind
  comm::Group world;                     // every rank (a private copy of the world)
  std::string placement;                 // one line on how groups sit on nodes and switches
                                         // (placement_notes)

  const comm::Group& group(plan::GroupKind kind) const {
    return groups[static_cast<size_t>(kind)];
  }
};

// A shard plan's group of kind `kind` for this rank (collective over world).
// ranks_in_order[pos] is the world rank at node-major position pos (what
// topology::Topology::ranks_in_order() returns); group ranks are the mesh's
// index_in_group, so a reduce-scatter hands each member the slice the plan
// assigns it. Named after plan::group_name.
comm::Group make_plan_group(MPI_Comm world, const plan::Mesh& mesh, plan::GroupKind kind,
                      const std::vector<int>& ranks_in_order);

// One line on where the groups of a plan sit, by kind: "P 4 ranks on 2 nodes (under
// one leaf switch); replica 2 ranks on 2 nodes (across leaf switches: block
// alignment, n1 (s1) and n3 (s2) in one group)". Worked out from every group's members
// and each member node's leaf switch. A kind whose groups cross switches gets a cause:
// the plan's size (no switch holds that many nodes; needs topology.switch_nodes), the
// allocation (fewer of its nodes are under any one switch), or block alignment (enough do, but
// the group's nodes straddle a switch boundary). Nothing about switches without
// switch information. Equal tasks per node, mesh shaped like the topology.
std::string placement_notes(const plan::Mesh& mesh, const topology::Topology& topology);

// Collective over world. Parses plan_text ("zero3", "p=2x1,g=2x1,os=8x1", ...)
// for the topology's shape (equal tasks per node required; else UsageError on
// every rank, naming the counts) and builds the groups. Groups of whole nodes
// take consecutive nodes in switch order, so they sit under one leaf switch
// whenever the topology allows it; `placement` says whether they do.
PlanGroups make_plan_groups(MPI_Comm world, const topology::Topology& topology,
                            const std::string& plan_text);

}  // namespace amsp::engine
