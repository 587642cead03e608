#include "comm/group.h"

#include <algorithm>
#include <utility>

#include "core/mpi_check.h"
#include "core/error.h"

namespace amsp::comm {

Group::Group(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)) {
  // Named for MPI tools (debuggers, the PMPI byte counter of the engine tests).
  if (comm_ != MPI_COMM_NULL) AMSP_MPI_CHECK(MPI_Comm_set_name(comm_, name_.c_str()));
  set_errors_return(comm_);
  AMSP_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  AMSP_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
}

Group::~Group() {
  int fin = 0;
  AMSP_MPI_CHECK(MPI_Finalized(&fin));
  if (comm_ != MPI_COMM_NULL && !fin) AMSP_MPI_CHECK(MPI_Comm_free(&comm_));
}

Group::Group(Group&& o) noexcept
    : comm_(std::exchange(o.comm_, MPI_COMM_NULL)), name_(std::move(o.name_)), size_(o.size_),
      rank_(o.rank_) {}

Group& Group::operator=(Group&& o) noexcept {
  if (this != &o) {
    Group old(std::move(*this));
    comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
    name_ = std::move(o.name_);
    size_ = o.size_;
    rank_ = o.rank_;
  }
  return *this;
}

Group make_group(MPI_Comm parent, const std::vector<int>& members, std::string name) {
  int me = 0;
  AMSP_MPI_CHECK(MPI_Comm_rank(parent, &me));
  const auto it = std::find(members.begin(), members.end(), me);
  if (it == members.end() || members.empty())
    abort_job(cat("group ", name, ": this rank is not among its members"));
  // Colour by the lowest member: equal exactly when the groups are the same.
  const int color = *std::min_element(members.begin(), members.end());
  const int key = static_cast<int>(it - members.begin());
  MPI_Comm comm = MPI_COMM_NULL;
  AMSP_MPI_CHECK(MPI_Comm_split(parent, color, key, &comm));
  Group g(comm, std::move(name));
  if (g.size() != static_cast<int>(members.size()) || g.rank() != key)
    abort_job(cat("group ", g.name(), ": ranks disagree on its members (expected ",
                  members.size(), " ranks, got ", g.size(), ")"));
  return g;
}

Group dup_group(MPI_Comm parent, std::string name) {
  MPI_Comm comm = MPI_COMM_NULL;
  AMSP_MPI_CHECK(MPI_Comm_dup(parent, &comm));
  return Group(comm, std::move(name));
}

}  // namespace amsp::comm
