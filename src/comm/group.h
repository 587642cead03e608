// A group of ranks that runs collectives together: an MPI communicator of its
// own (so its traffic never matches anyone else's), a name for messages and
// statistics ("P", "node", ...), and this rank's place in it.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>


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

}  // namespace amsp::comm
