// Stop requests. SIGUSR1 and SIGTERM, Slurm's warning before a time limit and
// its preemption signal, ask a training run to finish its step, save a
// checkpoint and exit kExitPreempted (75) for its job script to requeue.
//
// `amsp train` installs the handlers first thing, before option checks,
// MPI_Init, communicator set-up or data loading: a request that arrives at any
// moment of a job's life is remembered, never fatal, and the run acts on it at
// its next decision point (before its first step, or after a step).
//
// A job script must not pass a signal on before the ranks can take it: until a
// rank has installed its handlers, SIGUSR1 kills it. announce_ready() tells the
// script when every rank has: rank 0 creates the file AMSP_READY_FILE names
// (slurm/train.sbatch holds a signal back until then).
#pragma once

namespace amsp::stop {

// SIGUSR1 and SIGTERM set the request from now on. Idempotent.
void install();

// The signal that asked to stop (SIGUSR1 or SIGTERM), or 0. This process only:
// ranks agree on it collectively (the trainer does).
int requested();

// "SIGUSR1", "SIGTERM" or "no signal".
const char* signal_name(int sig);

// On rank 0 (root), once every rank has called install(): creates the file
// named by the environment variable AMSP_READY_FILE, if set. A file that
// cannot be created is a warning, not an error: the job still trains.
void announce_ready(bool root);

}  // namespace amsp::stop
