// Ranks agreeing on the outcome of a phase, so that an error on one rank ends
// every rank the same way instead of leaving the others waiting in the next
// collective. The one implementation the trainer, the checkpoint code and the
// evaluation share.
#pragma once

#include <mpi.h>

#include <exception>
#include <functional>
#include <string>

#include "core/error.h"

namespace amsp::comm {

// One rank's outcome of a phase: code 0, or the exit code and message of the
// error it threw; `rank` is the rank the agreed outcome came from.
struct Outcome {
  int code = 0;
  std::string message;
  int rank = -1;
};

// Runs f, turning an amsp::Error (its exit code) or any std::exception (exit
// code 1) into an Outcome.
template <typename F>
Outcome attempt(F&& f) {
  try {
    f();
    return {};
  } catch (const Error& e) {
    return {e.exit_code(), e.what()};
  } catch (const std::exception& e) {
    return {kExitFailure, e.what()};
  }
}

// Collective: the outcome of the lowest rank that failed (or success), on every rank.
Outcome agree(const Outcome& mine, MPI_Comm comm);

// Throws the outcome: UsageError for kExitUsage, Error otherwise; nothing on success.
void rethrow(const Outcome& outcome);

// Collective: runs fn on every rank; if it throws anywhere, every rank throws
// the lowest failing rank's error (prefixed "rank N: " when N is not 0).
void collectively(MPI_Comm comm, const std::function<void()>& fn);

// Collective: a barrier that polls (MPI_Ibarrier, MPI_Test) and sleeps
// poll_us between polls instead of spinning in MPI, for a background thread
// whose waits must leave the cores, and MPI's lock, to the training.
void quiet_barrier(MPI_Comm comm, int poll_us = 200);

// Broadcasts a string of any length from root.
void bcast_string(std::string* s, int root, MPI_Comm comm);

}  // namespace amsp::comm
