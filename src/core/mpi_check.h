// One family of checks for MPI calls, for every layer (core, so that topology
// and comm alike can use it). A failed call, or a collective that
// outlives its timeout, ends the whole job with MPI_Abort after one line on
// stderr naming the call, file:line, rank, host and MPI's own error string:
// one rank failing must never leave the others hanging in a collective.
#pragma once

#include <mpi.h>

#include <string>

namespace amsp::comm {

// "rank 3 of 8 on host n1" (or "rank ? on host h" before MPI_Init).
std::string where();

// Prints "amsp: error: <rank/host>: <message>" and aborts the job (MPI_Abort on
// MPI_COMM_WORLD; exit(1) when MPI is not initialised). Safe from any thread.
[[noreturn]] void abort_job(const std::string& message);

// Aborts naming `call` (the text of the call; only its function name is shown)
// unless rc is MPI_SUCCESS. Use through AMSP_MPI_CHECK.
void mpi_check(int rc, const char* call, const char* file, int line);

// The common end of every check (MPI here; CUDA, cuBLAS and NCCL in gpu/check.h):
// "<function> failed at <file>:<line>: <library's error string>", then abort_job.
[[noreturn]] void call_failed(const char* call, const char* file, int line,
                              const std::string& error);

// Communicators the comm layer creates return errors instead of aborting inside
// MPI, so that AMSP_MPI_CHECK can say where it happened.
void set_errors_return(MPI_Comm comm);

}  // namespace amsp::comm

#define AMSP_MPI_CHECK(call) ::amsp::comm::mpi_check((call), #call, __FILE__, __LINE__)
