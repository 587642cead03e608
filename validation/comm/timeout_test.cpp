// A collective one rank never joins must end the job with a message naming the
// rank, the group and the op, not hang it. Run with AMSP_COMM_TIMEOUT=1.5 under
// mpiexec -n 3; the test wants the message and exit code 1 (MPI_Abort's, kExitFailure).

#include <mpi.h>

#include <cstdio>
#include <vector>

#include "comm/communicator.h"

using namespace amsp;

int main(int argc, char** argv) {
  comm::MpiSession session(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  auto c = comm::make_mpi_communicator(comm::dup_group(MPI_COMM_WORLD, "P"));
  std::vector<float> v(1000, 1.0f);
  if (rank != 1) c->all_reduce(v.data(), 1000).wait();  // rank 1 never joins
  MPI_Barrier(MPI_COMM_WORLD);
  std::printf("rank %d: the stuck collective returned\n", rank);
  return 0;
}
