#include "comm/timed.h"

#include <chrono>
#include <thread>

#include "core/mpi_check.h"
#include "comm/communicator.h"
#include "core/error.h"

namespace amsp::comm {

void allreduce_sum(double* values, int n, MPI_Comm comm, const char* what, double timeout_s) {
  if (timeout_s <= 0) timeout_s = default_comm_timeout_s();
  MPI_Request req;
  AMSP_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, values, n, MPI_DOUBLE, MPI_SUM, comm, &req));
  const double deadline = now_seconds() + timeout_s;
  int done = 0;
  for (int spins = 0;; ++spins) {
    AMSP_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if (timeout_s > 0 && now_seconds() > deadline)
      abort_job(cat("timeout: all_reduce of the ", what, " on group world did not complete within ",
                    timeout_s, " s; another rank is probably stuck or dead "
                    "(--comm-timeout or AMSP_COMM_TIMEOUT change the limit)"));
    // Spin briefly (the usual case is microseconds), then let other threads run.
    if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace amsp::comm
