// A collective one rank never joins must end the job with a message naming the
// rank, the group and the op, not hang it. Run with AMSP_COMM_TIMEOUT=1.5 under
// mpiexec -n 3; the test wants the message and exit code 1 (MPI_Abort's, kExitFailure).
//
//   timeout_test [all_reduce | all_to_all]   rank 1 never joins that op
//   timeout_test mismatch                    rank 1 issues an all-to-all of 5 int32
//                                            where ranks 0 and 2 issue 4: the
//                                            mismatch check must name rank 1
//   timeout_test nccl_mismatch               the same with an all-gather on the NCCL
//                                            backend (over the emulated NCCL, which
//                                            hangs in it, as NCCL would): its check,
//                                            beside the op, must name rank 1

#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/nccl/nccl_communicator.h"

using namespace amsp;

int main(int argc, char** argv) {
  comm::MpiSession session(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "all_reduce";
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (mode == "nccl_mismatch") {
    cudaStream_t compute = nullptr;
    cudaStreamCreate(&compute);
    void* buf = nullptr;
    cudaMalloc(&buf, 3 * 5 * sizeof(int32_t));
    comm::NcclCommunicator c(comm::dup_group(MPI_COMM_WORLD, "P"), compute);
    const int64_t count = rank == 1 ? 5 : 4;
    c.all_gather(static_cast<int32_t*>(buf) + rank * count, count, buf, DType::kI32).wait();
    std::printf("rank %d: the mismatched all-gather returned\n", rank);
    return 0;
  }
  auto c = comm::make_mpi_communicator(comm::dup_group(MPI_COMM_WORLD, "P"));
  std::vector<float> v(3000, 1.0f), w(3000, 0.0f);
  if (mode == "mismatch") {
    const int64_t count = rank == 1 ? 5 : 4;
    c->all_to_all(v.data(), count, w.data(), DType::kI32).wait();
  } else if (rank != 1) {  // rank 1 never joins
    if (mode == "all_to_all") c->all_to_all(v.data(), 1000, w.data()).wait();
    else c->all_reduce(v.data(), 1000).wait();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  std::printf("rank %d: the stuck collective returned\n", rank);
  return 0;
}
