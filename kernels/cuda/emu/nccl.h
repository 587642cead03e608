// The subset of NCCL amsp uses, for the emulation build: <nccl.h>'s names and
// signatures, implemented over MPI (nccl.cpp). ncclCommInitRank finds the
// ranks that passed the same unique id with one MPI_Comm_split of a copy of
// MPI_COMM_WORLD, so every world rank must create its communicators in the
// same order (amsp's engine does). Operations run when they are issued, in
// stream order, with blocking MPI collectives; sums of bf16 are taken in fp32
// in rank order and rounded once.
//
// More precisely. MPI must be initialised (MPI_THREAD_MULTIPLE when several
// threads issue). ncclCommInitRank checks, inside the new group, that every
// member passed the same id, the same nranks and a distinct rank 0..nranks-1,
// and otherwise fails on every member with ncclInvalidUsage and a line on
// stderr. Every sum (fp32, fp64, int32 wrapping, bf16 through fp32) is taken
// in rank order 0, 1, ..., n-1 after an alltoall of the blocks, so results are
// identical on all ranks whatever MPI's algorithms. Ops record their reads of
// sendbuff and writes of recvbuff on `stream` for the happens-before checker
// and take the caller's file and line as defaulted trailing arguments (as
// runtime.h's copies do); buffers must be cudaMalloc'd or cudaMallocHost'd.
// Collectives run at issue, inside a group too. ncclSend and ncclRecv have
// NCCL's semantics: outside a group each is an operation of its own that
// returns when its peer has matched it; between ncclGroupStart and the
// outermost ncclGroupEnd they are queued (their accesses recorded on their
// streams at the call) and ncclGroupEnd posts them all at once and returns
// when all have completed, so that a rank may send to and receive from every
// peer, itself included, in one group. Sends and receives between two ranks
// of a communicator match in the order they were issued. ncclCommAbort marks the
// communicator aborted (it cannot interrupt a peer's MPI call): later ops on
// it return ncclInvalidUsage, ncclCommDestroy included (the handle stays valid).
// A peer that never arrives blocks an op in MPI forever unless
// amsp::emu::nccl_set_timeout was given a limit: past it the op returns
// ncclRemoteError, and ncclCommGetAsyncError reports it too.
//
// AMSP_EMU_NCCL_FAIL=<op>:<n>[:async] makes the n-th call (from 1, counted per
// process) of <op> (allgather, reducescatter, allreduce, broadcast or any)
// fail (any: every call counts, ncclSend and ncclRecv included),
// so that callers' error paths can be tested: it returns
// ncclSystemError without communicating, or, with :async, completes and then
// ncclCommGetAsyncError reports ncclRemoteError. Set it on every rank (a rank
// that fails alone leaves its peers waiting).
#pragma once

#include "kernels/cuda/emu/runtime.h"

struct ncclComm;
typedef ncclComm* ncclComm_t;

#define NCCL_UNIQUE_ID_BYTES 128
struct ncclUniqueId {
  char internal[NCCL_UNIQUE_ID_BYTES];
};

enum ncclResult_t {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
};
enum ncclDataType_t { ncclInt32 = 2, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9 };
enum ncclRedOp_t { ncclSum = 0 };

ncclResult_t ncclGetUniqueId(ncclUniqueId* id);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                           const char* file = __builtin_FILE(), int line = __builtin_LINE());
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream, const char* file = __builtin_FILE(),
                               int line = __builtin_LINE());
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream, const char* file = __builtin_FILE(),
                           int line = __builtin_LINE());
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream, const char* file = __builtin_FILE(),
                           int line = __builtin_LINE());
// Point to point (NCCL 2.7+): count elements to or from group rank `peer`.
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream, const char* file = __builtin_FILE(),
                      int line = __builtin_LINE());
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream, const char* file = __builtin_FILE(),
                      int line = __builtin_LINE());
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();
const char* ncclGetErrorString(ncclResult_t result);
// The emulation's own version, 2.28.0 (NCCL's code 10000 * major + 100 * minor
// + patch: 22800); it names no installed library.
ncclResult_t ncclGetVersion(int* version);

namespace amsp::emu {
// How long an op may wait for its peers, in seconds; 0 (the default): forever.
// For the caller's own timeout setting (comm/communicator.h's), which the
// emulation cannot see: its ops block at issue, not at the caller's wait.
void nccl_set_timeout(double seconds);
}  // namespace amsp::emu
