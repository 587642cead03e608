// A group of ranks that runs collectives together: an MPI communicator of its
// own (so its traffic never matches anyone else's), a name for messages and
// statistics ("P", "node", ...), and this rank's place in it.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "plan/mesh.h"

namespace amsp::comm {

class Group {
 public:
  Group() = default;
  // Takes ownership of comm (freed on destruction) and sets MPI_ERRORS_RETURN on it.
  Group(MPI_Comm comm, std::string name);
  ~Group();
  Group(Group&& o) noexcept;
  Group& operator=(Group&& o) noexcept;
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  MPI_Comm comm() const { return comm_; }
  const std::string& name() const { return name_; }
  int size() const { return size_; }
  int rank() const { return rank_; }  // this rank's index in the group
  bool valid() const { return comm_ != MPI_COMM_NULL; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::string name_;
  int size_ = 0, rank_ = -1;
};

// Collective over parent. `members` are the parent ranks of this rank's group
// in group order (index i in the list is group rank i), and must include the
// calling rank; the groups of all ranks must partition parent. Aborts the job
// if the ranks disagree.
Group make_group(MPI_Comm parent, const std::vector<int>& members, std::string name);

// A private copy of parent (collective).
Group dup_group(MPI_Comm parent, std::string name);

// A shard plan's group of kind `kind` for this rank (collective over world).
// ranks_in_order[pos] is the world rank at node-major position pos (what
// topology::Topology::ranks_in_order() returns); group ranks are the mesh's
// index_in_group, so a reduce-scatter hands each member the slice the plan
// assigns it. Named after plan::group_name.
Group make_plan_group(MPI_Comm world, const plan::Mesh& mesh, plan::GroupKind kind,
                      const std::vector<int>& ranks_in_order);

}  // namespace amsp::comm
