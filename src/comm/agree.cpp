#include "comm/agree.h"

#include <chrono>
#include <climits>
#include <thread>

#include "core/mpi_check.h"

namespace amsp::comm {

namespace {

// Tests `request` until it completes, sleeping poll_us between tests.
void wait_quietly(MPI_Request& request, int poll_us) {
  for (int done = 0;;) {
    AMSP_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    std::this_thread::sleep_for(std::chrono::microseconds(poll_us));
  }
}

}  // namespace

void quiet_barrier(MPI_Comm comm, int poll_us) {
  MPI_Request request = MPI_REQUEST_NULL;
  AMSP_MPI_CHECK(MPI_Ibarrier(comm, &request));
  wait_quietly(request, poll_us);
}

void bcast_string(std::string* s, int root, MPI_Comm comm) {
  int64_t n = static_cast<int64_t>(s->size());
  AMSP_MPI_CHECK(MPI_Bcast(&n, 1, MPI_INT64_T, root, comm));
  s->resize(static_cast<size_t>(n));
  if (n > 0) AMSP_MPI_CHECK(MPI_Bcast(s->data(), static_cast<int>(n), MPI_CHAR, root, comm));
}

Outcome agree(const Outcome& mine, MPI_Comm comm) {
  int rank = 0;
  AMSP_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  int first = mine.code ? rank : INT_MAX;
  // The ranks reach this at different times (after loading, planning, ...):
  // the early ones wait without spinning, so that ranks sharing cores leave
  // them to the ones still working.
  MPI_Request request = MPI_REQUEST_NULL;
  AMSP_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm, &request));
  wait_quietly(request, 50);
  if (first == INT_MAX) return {};
  Outcome o = mine;
  AMSP_MPI_CHECK(MPI_Bcast(&o.code, 1, MPI_INT, first, comm));
  bcast_string(&o.message, first, comm);
  o.rank = first;
  return o;
}

void rethrow(const Outcome& o) {
  if (!o.code) return;
  if (o.code == kExitUsage) throw UsageError(o.message);
  throw Error(o.message, o.code);
}

void collectively(MPI_Comm comm, const std::function<void()>& fn) {
  Outcome o = agree(attempt(fn), comm);
  if (o.code && o.rank != 0) o.message = cat("rank ", o.rank, ": ", o.message);
  rethrow(o);
}

}  // namespace amsp::comm
