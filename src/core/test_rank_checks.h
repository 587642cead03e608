// The checks of a test program that runs on several MPI ranks (header-only; for
// tests, not part of amsp_core): a check is collective and passes only where it
// passes on every rank, and the rank that failed names what failed.
#pragma once

#include <mpi.h>

#include <cstdio>
#include <string>

namespace amsp::test {

class RankChecks {
 public:
  // Collective over MPI_COMM_WORLD: every rank calls it, in the same order.
  void check(bool ok, const std::string& what) {
    int all = ok ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (all) {
      ++passed_;
      return;
    }
    ++failed_;
    if (!ok) std::fprintf(stderr, "FAIL (rank %d): %s\n", rank(), what.c_str());
  }

  // A failure of this rank alone (an exception that ended its checks): not collective.
  void fail_here(const std::string& what) {
    ++failed_;
    std::fprintf(stderr, "rank %d: %s\n", rank(), what.c_str());
  }

  // Collective: rank 0 prints "N passed, M failed" (M: the most any rank counted);
  // the program's exit status.
  int finish() {
    int failed = failed_;
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank() == 0) std::printf("%d passed, %d failed\n", passed_, failed);
    return failed ? 1 : 0;
  }

 private:
  static int rank() {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }
  int passed_ = 0, failed_ = 0;
};

}  // namespace amsp::test
