#include "comm/timed.h"

#include <chrono>
#include <optional>
#include <thread>

#include "core/mpi_check.h"
#include "comm/communicator.h"
#include "comm/watchdog.h"
#include "core/error.h"

namespace amsp::comm {

void allreduce_sum(double* values, int n, MPI_Comm comm, const char* what, double timeout_s) {
  if (timeout_s <= 0) timeout_s = default_comm_timeout_s();
  // The world's blocking collectives are counted like a communicator's ops,
  // so that the watchdog can name a rank that never reached one.
  std::optional<watchdog::Waiting> waiting;
  uint64_t seq = 0;
  if (comm == MPI_COMM_WORLD) {
    watchdog::Entry& world = watchdog::world_entry();
    seq = world.issued() + 1;
    world.set_issued(seq);
    waiting.emplace(world, Op::kAllReduce, seq);
  }
  MPI_Request req;
  AMSP_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, values, n, MPI_DOUBLE, MPI_SUM, comm, &req));
  const double t0 = now_seconds(), deadline = t0 + timeout_s;
  int done = 0;
  for (int spins = 0;; ++spins) {
    AMSP_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if (timeout_s > 0 && now_seconds() > deadline && seq) {
      watchdog::hang(watchdog::world_entry(), Op::kAllReduce, seq, now_seconds() - t0);
    }
    if (timeout_s > 0 && now_seconds() > deadline)
      abort_job(cat("timeout: all_reduce of the ", what, " on group world did not complete within ",
                    timeout_s, " s; another rank is probably stuck or dead "
                    "(--comm-timeout or AMSP_COMM_TIMEOUT change the limit)"));
    // Spin briefly (the usual case is microseconds), then let other threads run.
    if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace amsp::comm
