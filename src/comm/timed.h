// Small blocking collectives with a deadline, for the few values the training
// loop reduces outside the communicators (loss sums, the stop flag, busy
// times): a rank that is stuck or dead ends the job with a message instead of a
// silent hang.
#pragma once

#include <mpi.h>

namespace amsp::comm {

// Sums n doubles over comm in place. Past timeout_s (0: AMSP_COMM_TIMEOUT or
// 600) the job is aborted, naming this rank and `what`.
void allreduce_sum(double* values, int n, MPI_Comm comm, const char* what, double timeout_s = 0);

}  // namespace amsp::comm
