// Runs a command in a child process with a deadline: for work on untrusted
// input that could crash or hang the process doing it (a damaged HDF5 file can
// make the library segfault or loop). The child's crash or hang stays the
// child's: the caller gets a result in bounded time and can say what happened.
#pragma once

#include <string>
#include <vector>

namespace amsp {

struct ChildResult {
  bool timed_out = false;  // killed (SIGKILL) at the deadline
  int exit_code = -1;      // when it exited normally
  int signal = 0;          // when a signal ended it (the deadline's SIGKILL included)
  std::string output;      // stdout and stderr, interleaved, at most the last 64 KiB
  bool ok() const { return !timed_out && signal == 0 && exit_code == 0; }
  // "exit 1", "killed by SIGSEGV", "no answer within 60 s"
  std::string describe(double timeout_s) const;
};

// Runs argv[0] (a path) with argv, without a shell, in its own process group,
// with the environment of this process minus the variables of MPI launchers
// and Slurm job steps (PMI_*, PMIX_*, HYDRA_*, MPIR_*, OMPI_*, I_MPI_*,
// SLURM_STEP*, SLURM_PROCID, ...), so that a child of an MPI rank is never
// mistaken for another rank. The child is killed if this process dies. Waits
// up to timeout_s seconds, then kills the child's process group. Throws Error
// if the child cannot be started (exit 127 if argv[0] cannot be executed).
ChildResult run_child(const std::vector<std::string>& argv, double timeout_s);

// This executable's path (/proc/self/exe), to run one of its own subcommands.
std::string self_executable();

}  // namespace amsp
