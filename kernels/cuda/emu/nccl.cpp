// NCCL over MPI (nccl.h). Each communicator is an MPI communicator split off
// a private copy of MPI_COMM_WORLD; each collective is one or two MPI
// collectives run to completion at issue, after a small all-reduce that
// matches the ranks' calls (a mismatch hangs, as in NCCL: match()); ncclSend
// and ncclRecv are MPI_Isend and MPI_Irecv, posted together at the end of
// their group. Sums are ours, in rank order, so that every rank gets the same
// bits (as comm/mpi_communicator.cpp does for bf16).
#include "kernels/cuda/emu/nccl.h"

#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kernels/common/math.h"
#include "kernels/cuda/emu/hb.h"

struct ncclComm {
  MPI_Comm mpi = MPI_COMM_NULL;
  int rank = 0, nranks = 0;
  bool aborted = false;
  std::atomic<ncclResult_t> async_error{ncclSuccess};
};

namespace {

using amsp::emu::Memory;

std::mutex g_mu;
std::set<ncclComm_t> g_comms;  // live and aborted
std::atomic<double> g_timeout_s{0};
thread_local int t_group_depth = 0;

// A send or receive, queued until the end of its group.
struct P2p {
  bool send = false;
  ncclComm_t comm = nullptr;
  void* buf = nullptr;  // a send's is const
  size_t count = 0;
  ncclDataType_t type = ncclFloat32;
  int peer = 0;
  bool async_fail = false;  // injected: report ncclRemoteError once it completed
};
thread_local std::vector<P2p> t_p2p;  // this thread's open group's

void warn(const std::string& message) {
  std::fprintf(stderr, "amsp emu nccl: %s\n", message.c_str());
  std::fflush(stderr);
}

// ---- injected failures (AMSP_EMU_NCCL_FAIL) ---------------------------------------

struct Injection {
  std::string op;  // "" when none
  long nth = 0;
  bool async = false;
};

const Injection& injection() {
  static const Injection inj = [] {
    Injection i;
    const char* v = std::getenv("AMSP_EMU_NCCL_FAIL");
    if (!v || !*v) return i;
    const std::string s = v;
    const size_t c1 = s.find(':'), c2 = s.find(':', c1 == std::string::npos ? c1 : c1 + 1);
    const std::string op = s.substr(0, c1);
    const std::string n = c1 == std::string::npos ? "" : s.substr(c1 + 1, c2 - c1 - 1);
    const std::string mode = c2 == std::string::npos ? "" : s.substr(c2 + 1);
    char* end = nullptr;
    i.nth = std::strtol(n.c_str(), &end, 10);
    const bool op_ok = op == "allgather" || op == "reducescatter" || op == "allreduce" ||
                       op == "broadcast" || op == "any";
    if (!op_ok || n.empty() || *end || i.nth < 1 || (!mode.empty() && mode != "async")) {
      warn("AMSP_EMU_NCCL_FAIL=" + s +
           ": expected <op>:<n>[:async], op one of allgather, reducescatter, allreduce, "
           "broadcast, any, n >= 1");
      std::abort();
    }
    i.op = op;
    i.async = mode == "async";
    return i;
  }();
  return inj;
}

enum class Fail { kNo, kNow, kAsync };

// Counts this call of `op` and says whether it is the one to fail.
Fail injected(const char* op) {
  const Injection& inj = injection();
  if (inj.op.empty() || (inj.op != "any" && inj.op != op)) return Fail::kNo;
  static std::atomic<long> calls{0};
  if (++calls != inj.nth) return Fail::kNo;
  warn(std::string("injected failure of ") + op + " call " + std::to_string(inj.nth) +
       " (AMSP_EMU_NCCL_FAIL)");
  return inj.async ? Fail::kAsync : Fail::kNow;
}

// ---- MPI ---------------------------------------------------------------------------------

size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt32: return 4;
    case ncclFloat32: return 4;
    case ncclFloat64: return 8;
    case ncclBfloat16: return 2;
  }
  return 0;
}

MPI_Datatype mpi_type(ncclDataType_t t) {
  switch (t) {
    case ncclInt32: return MPI_INT32_T;
    case ncclFloat32: return MPI_FLOAT;
    case ncclFloat64: return MPI_DOUBLE;
    case ncclBfloat16: return MPI_UINT16_T;  // moved as bits; sums are ours
  }
  return MPI_DATATYPE_NULL;
}

ncclResult_t mpi_failed(ncclComm_t c, const char* call, int rc) {  // call: "op (MPI call)"
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  warn(std::string(call) + " failed on rank " + std::to_string(c->rank) + " of " +
       std::to_string(c->nranks) + ": " + text);
  c->async_error = ncclSystemError;
  return ncclSystemError;
}

// Host memory an MPI request of the emulation reads or writes. A request that
// times out is left in MPI, which may still use its buffers when the late peer
// comes: abandon() then keeps them (a leak, once, on a job that is failing)
// instead of freeing memory MPI would write into.
class Staging {
 public:
  explicit Staging(size_t bytes) : bytes_(new char[bytes]()) {}
  ~Staging() {
    if (!abandoned_) delete[] bytes_;
  }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  char* data() const { return bytes_; }
  // Passes r through; keeps the buffer when r says the request was left.
  ncclResult_t settled(ncclResult_t r) {
    abandoned_ = r != ncclSuccess;
    return r;
  }

 private:
  char* bytes_;
  bool abandoned_ = false;
};

// Completes the non-blocking collective `mpi_call` of op `op`: MPI_Wait, or
// polling up to the timeout.
ncclResult_t finish(ncclComm_t c, const char* op, const char* mpi_call, int rc, MPI_Request* req) {
  const std::string call = std::string(op) + " (" + mpi_call + ")";
  if (rc != MPI_SUCCESS) return mpi_failed(c, call.c_str(), rc);
  const double timeout = g_timeout_s.load();
  if (timeout <= 0) {
    rc = MPI_Wait(req, MPI_STATUS_IGNORE);
    return rc == MPI_SUCCESS ? ncclSuccess : mpi_failed(c, call.c_str(), rc);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
  for (;;) {
    int done = 0;
    rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_failed(c, call.c_str(), rc);
    if (done) return ncclSuccess;
    if (std::chrono::steady_clock::now() > deadline) {
      warn(call + " on rank " + std::to_string(c->rank) + " of " +
           std::to_string(c->nranks) + ": peers did not arrive within " +
           std::to_string(timeout) + " s");
      c->async_error = ncclRemoteError;
      return ncclRemoteError;
    }
    sched_yield();
  }
}

// ---- sums in rank order -----------------------------------------------------------------

// out[i] = blocks[0][i] + blocks[1][i] + ... + blocks[n-1][i], accumulated in
// Acc in that order; Load and Store convert between T and Acc.
template <class T, class Acc, class Load, class Store>
void sum_in_order(const void* blocks, int n, size_t block, void* out, Load load, Store store) {
  const T* b = static_cast<const T*>(blocks);
  T* o = static_cast<T*>(out);
  std::vector<Acc> acc(block);
  for (size_t i = 0; i < block; ++i) acc[i] = load(b[i]);
  for (int r = 1; r < n; ++r)
    for (size_t i = 0; i < block; ++i) acc[i] += load(b[r * block + i]);
  for (size_t i = 0; i < block; ++i) o[i] = store(acc[i]);
}

void sum_blocks(ncclDataType_t t, const void* blocks, int n, size_t block, void* out) {
  auto same = [](auto x) { return x; };
  switch (t) {
    case ncclFloat32: sum_in_order<float, float>(blocks, n, block, out, same, same); break;
    case ncclFloat64: sum_in_order<double, double>(blocks, n, block, out, same, same); break;
    case ncclInt32:  // wraps, as NCCL's does, without signed overflow
      sum_in_order<int32_t, uint32_t>(
          blocks, n, block, out, [](int32_t x) { return static_cast<uint32_t>(x); },
          [](uint32_t x) { return static_cast<int32_t>(x); });
      break;
    case ncclBfloat16:
      sum_in_order<uint16_t, float>(blocks, n, block, out, amsp::kernels::bf16_to_float,
                                    amsp::kernels::float_to_bf16);
      break;
  }
}

}  // namespace

// ---- the ops ----------------------------------------------------------------------------

namespace {

ncclResult_t check_comm(ncclComm_t c, const char* op) {
  std::lock_guard lock(g_mu);
  if (!c || !g_comms.count(c)) {
    warn(std::string(op) + ": not a communicator");
    return ncclInvalidArgument;
  }
  if (c->aborted) {
    warn(std::string(op) + ": the communicator was aborted");
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}

// One op's call: what it is, where from, and the bytes it reads and writes.
struct Call {
  const char* name;  // "ncclAllReduce"
  const char* key;   // "allreduce", for AMSP_EMU_NCCL_FAIL
  ncclComm_t comm;
  ncclDataType_t type;
  cudaStream_t stream;
  size_t mpi_count;  // the largest count one MPI call of the op takes
  const void* send;
  size_t send_bytes;
  void* recv;
  size_t recv_bytes;
  const char* file;
  int line;
};

ncclResult_t check_buffer(const Call& c, const char* what, const void* p, size_t bytes) {
  if (bytes == 0) return ncclSuccess;
  const Memory m = amsp::emu::memory_of(p, bytes);
  if (m == Memory::kDevice || m == Memory::kPinned) return ncclSuccess;
  const char* why =
      m == Memory::kHost ? "is not device memory" : "runs past the end of its allocation";
  char text[200];
  std::snprintf(text, sizeof text, "%s at %s:%d: %s [%p, +%zu bytes) %s", c.name, c.file, c.line,
                what, p, bytes, why);
  warn(text);
  return ncclInvalidArgument;
}

bool aborted(ncclComm_t c) {
  std::lock_guard lock(g_mu);
  return c->aborted;
}

// NCCL requires every rank of a communicator to call the same collectives in
// the same order with the same counts, and what it does otherwise is undefined:
// a hang, or data matched to the wrong call. The emulation compares the ranks'
// calls (an all-reduce of a signature and its complement under MAX) and, where
// they differ, hangs as NCCL would: until the timeout, then as if a peer never
// arrived (or until the communicator is aborted).
ncclResult_t match(const Call& c) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the op, its bytes and its type
  const auto mix = [&h](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i)
      h = (h ^ static_cast<const unsigned char*>(p)[i]) * 1099511628211ull;
  };
  mix(c.key, std::strlen(c.key));
  mix(&c.recv_bytes, sizeof c.recv_bytes);
  mix(&c.type, sizeof c.type);
  Staging staging(sizeof(uint64_t[2]));
  auto* sig = reinterpret_cast<uint64_t*>(staging.data());
  sig[0] = h;
  sig[1] = ~h;
  MPI_Request req = MPI_REQUEST_NULL;
  const int rc = MPI_Iallreduce(MPI_IN_PLACE, sig, 2, MPI_UINT64_T, MPI_MAX, c.comm->mpi, &req);
  if (const ncclResult_t r = staging.settled(finish(c.comm, c.name, "MPI_Iallreduce", rc, &req));
      r != ncclSuccess)
    return r;
  if (sig[0] == h && sig[1] == ~h) return ncclSuccess;
  const double timeout = g_timeout_s.load();
  warn(std::string(c.name) + " on rank " + std::to_string(c.comm->rank) + " of " +
       std::to_string(c.comm->nranks) + ": the ranks called different collectives or counts; " +
       "NCCL would hang, and so does the emulation" +
       (timeout > 0 ? " for " + std::to_string(timeout) + " s" : ""));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
  while ((timeout <= 0 || std::chrono::steady_clock::now() < deadline) && !aborted(c.comm))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  c.comm->async_error = ncclRemoteError;
  return ncclRemoteError;
}

// Validates the call, decides on an injected failure, and records its accesses
// on its stream. ncclSuccess: go on and communicate.
ncclResult_t begin(const Call& c, Fail* fail) {
  if (const ncclResult_t rc = check_comm(c.comm, c.name); rc != ncclSuccess) return rc;
  if (type_bytes(c.type) == 0 || c.mpi_count > static_cast<size_t>(INT_MAX)) {
    warn(std::string(c.name) + ": unsupported datatype or a count over INT_MAX");
    return ncclInvalidArgument;
  }
  if (!amsp::emu::stream_valid(c.stream)) {
    warn(std::string(c.name) + ": invalid stream");
    return ncclInvalidArgument;
  }
  if (ncclResult_t rc = check_buffer(c, "sendbuff", c.send, c.send_bytes); rc != ncclSuccess)
    return rc;
  if (ncclResult_t rc = check_buffer(c, "recvbuff", c.recv, c.recv_bytes); rc != ncclSuccess)
    return rc;
  *fail = injected(c.key);
  if (*fail == Fail::kNow) return ncclSystemError;
  amsp::emu::op_access(c.stream, c.send, c.send_bytes, false, c.name, c.file, c.line);
  amsp::emu::op_access(c.stream, c.recv, c.recv_bytes, true, c.name, c.file, c.line);
  return ncclSuccess;
}

// begin() for a collective, then its match with the other ranks' calls.
ncclResult_t begin_collective(const Call& c, Fail* fail) {
  const ncclResult_t rc = begin(c, fail);
  return rc == ncclSuccess ? match(c) : rc;
}

ncclResult_t end(const Call& c, Fail fail, ncclResult_t rc) {
  if (rc == ncclSuccess && fail == Fail::kAsync) c.comm->async_error = ncclRemoteError;
  return rc;
}

// Each rank's contributions to its own block of `blocks_in` (n blocks of
// `block` elements) summed in rank order into `out`.
ncclResult_t reduce_blocks(const Call& c, const void* blocks_in, size_t block, void* out) {
  const size_t eb = type_bytes(c.type);
  Staging blocks(block * eb * c.comm->nranks);
  MPI_Request req = MPI_REQUEST_NULL;
  const int count = static_cast<int>(block);
  const MPI_Datatype t = mpi_type(c.type);
  int rc = MPI_Ialltoall(blocks_in, count, t, blocks.data(), count, t, c.comm->mpi, &req);
  const ncclResult_t r = blocks.settled(finish(c.comm, c.name, "MPI_Ialltoall", rc, &req));
  if (r != ncclSuccess) return r;
  sum_blocks(c.type, blocks.data(), c.comm->nranks, block, out);
  return ncclSuccess;
}

}  // namespace

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                           const char* file, int line) {
  if (const ncclResult_t rc = check_comm(comm, "ncclAllGather"); rc != ncclSuccess) return rc;
  const size_t bytes = sendcount * type_bytes(datatype);
  const Call c{"ncclAllGather", "allgather", comm, datatype, stream, sendcount, sendbuff,
               bytes, recvbuff, bytes * comm->nranks, file, line};
  Fail fail = Fail::kNo;
  if (const ncclResult_t rc = begin_collective(c, &fail); rc != ncclSuccess) return rc;
  const bool in_place = sendbuff == static_cast<char*>(recvbuff) + bytes * comm->rank;
  const int n = static_cast<int>(sendcount);
  const MPI_Datatype t = mpi_type(datatype);
  MPI_Request req = MPI_REQUEST_NULL;
  const int rc = MPI_Iallgather(in_place ? MPI_IN_PLACE : sendbuff, n, t, recvbuff, n, t,
                                comm->mpi, &req);
  return end(c, fail, finish(comm, c.name, "MPI_Iallgather", rc, &req));
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream, const char* file, int line) {
  if (const ncclResult_t rc = check_comm(comm, "ncclReduceScatter"); rc != ncclSuccess) return rc;
  if (op != ncclSum) return ncclInvalidArgument;
  const size_t bytes = recvcount * type_bytes(datatype);
  const Call c{"ncclReduceScatter", "reducescatter", comm, datatype, stream, recvcount, sendbuff,
               bytes * comm->nranks, recvbuff, bytes, file, line};
  Fail fail = Fail::kNo;
  if (const ncclResult_t rc = begin_collective(c, &fail); rc != ncclSuccess) return rc;
  return end(c, fail, recvcount ? reduce_blocks(c, sendbuff, recvcount, recvbuff) : ncclSuccess);
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream, const char* file, int line) {
  if (const ncclResult_t rc = check_comm(comm, "ncclAllReduce"); rc != ncclSuccess) return rc;
  if (op != ncclSum) return ncclInvalidArgument;
  const size_t eb = type_bytes(datatype), n = static_cast<size_t>(comm->nranks);
  const size_t block = (count + n - 1) / n;
  const Call c{"ncclAllReduce", "allreduce", comm, datatype, stream, block, sendbuff,
               count * eb, recvbuff, count * eb, file, line};
  Fail fail = Fail::kNo;
  if (const ncclResult_t rc = begin_collective(c, &fail); rc != ncclSuccess) return rc;
  if (count == 0) return end(c, fail, ncclSuccess);
  // A reduce-scatter of a copy padded to n equal blocks, then an all-gather.
  Staging padded(block * n * eb);  // zeroed
  std::memcpy(padded.data(), sendbuff, count * eb);
  char* mine = padded.data() + comm->rank * block * eb;
  if (const ncclResult_t rc = padded.settled(reduce_blocks(c, padded.data(), block, mine));
      rc != ncclSuccess)
    return rc;
  MPI_Request req = MPI_REQUEST_NULL;
  const int b = static_cast<int>(block);
  const MPI_Datatype t = mpi_type(datatype);
  const int rc = MPI_Iallgather(MPI_IN_PLACE, b, t, padded.data(), b, t, comm->mpi, &req);
  if (const ncclResult_t r = padded.settled(finish(comm, c.name, "MPI_Iallgather", rc, &req));
      r != ncclSuccess)
    return r;
  std::memcpy(recvbuff, padded.data(), count * eb);
  return end(c, fail, ncclSuccess);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream, const char* file, int line) {
  if (const ncclResult_t rc = check_comm(comm, "ncclBroadcast"); rc != ncclSuccess) return rc;
  if (root < 0 || root >= comm->nranks) return ncclInvalidArgument;
  const size_t bytes = count * type_bytes(datatype);
  const bool is_root = comm->rank == root;
  const Call c{"ncclBroadcast", "broadcast", comm, datatype, stream, count,
               is_root ? sendbuff : nullptr, is_root ? bytes : 0, recvbuff, bytes, file, line};
  Fail fail = Fail::kNo;
  if (const ncclResult_t rc = begin_collective(c, &fail); rc != ncclSuccess) return rc;
  if (is_root && sendbuff != recvbuff && bytes) std::memmove(recvbuff, sendbuff, bytes);
  MPI_Request req = MPI_REQUEST_NULL;
  const int rc = MPI_Ibcast(recvbuff, static_cast<int>(count), mpi_type(datatype), root,
                            comm->mpi, &req);
  return end(c, fail, finish(comm, c.name, "MPI_Ibcast", rc, &req));
}

// ---- point to point -----------------------------------------------------------------------

namespace {

// The tag of every send and receive: MPI matches messages between two ranks of
// a communicator in the order they were sent, as NCCL does.
constexpr int kP2pTag = 0x4e43;

// Posts every queued send and receive, then completes them all: MPI_Waitall,
// or polling up to the timeout.
ncclResult_t run_p2p(const std::vector<P2p>& ops) {
  std::vector<MPI_Request> reqs(ops.size(), MPI_REQUEST_NULL);
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2p& o = ops[i];
    const int count = static_cast<int>(o.count);
    const MPI_Datatype t = mpi_type(o.type);
    const int rc = o.send ? MPI_Isend(o.buf, count, t, o.peer, kP2pTag, o.comm->mpi, &reqs[i])
                          : MPI_Irecv(o.buf, count, t, o.peer, kP2pTag, o.comm->mpi, &reqs[i]);
    if (rc != MPI_SUCCESS)
      return mpi_failed(o.comm, o.send ? "ncclSend (MPI_Isend)" : "ncclRecv (MPI_Irecv)", rc);
  }
  const int n = static_cast<int>(reqs.size());
  const double timeout = g_timeout_s.load();
  if (timeout <= 0) {
    const int rc = MPI_Waitall(n, reqs.data(), MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_failed(ops.front().comm, "ncclGroupEnd (MPI_Waitall)", rc);
  } else {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
    for (int done = 0; !done;) {
      const int rc = MPI_Testall(n, reqs.data(), &done, MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS) return mpi_failed(ops.front().comm, "ncclGroupEnd (MPI_Testall)", rc);
      if (done) break;
      if (std::chrono::steady_clock::now() > deadline) {
        for (size_t i = 0; i < ops.size(); ++i) {
          int complete = 1;
          MPI_Request_get_status(reqs[i], &complete, MPI_STATUS_IGNORE);
          if (complete) continue;
          const P2p& o = ops[i];
          warn(std::string(o.send ? "ncclSend to " : "ncclRecv from ") + std::to_string(o.peer) +
               " on rank " + std::to_string(o.comm->rank) + " of " +
               std::to_string(o.comm->nranks) + ": the peer did not arrive within " +
               std::to_string(timeout) + " s");
          o.comm->async_error = ncclRemoteError;
        }
        return ncclRemoteError;
      }
      sched_yield();
    }
  }
  for (const P2p& o : ops)
    if (o.async_fail) o.comm->async_error = ncclRemoteError;
  return ncclSuccess;
}

ncclResult_t p2p(bool send, void* buf, size_t count, ncclDataType_t datatype, int peer,
                 ncclComm_t comm, cudaStream_t stream, const char* file, int line) {
  const char* name = send ? "ncclSend" : "ncclRecv";
  if (const ncclResult_t rc = check_comm(comm, name); rc != ncclSuccess) return rc;
  if (peer < 0 || peer >= comm->nranks) {
    warn(std::string(name) + ": peer " + std::to_string(peer) + " outside the communicator's " +
         std::to_string(comm->nranks) + " ranks");
    return ncclInvalidArgument;
  }
  const size_t bytes = count * type_bytes(datatype);
  const Call c{name, send ? "send" : "recv", comm, datatype, stream, count,
               send ? buf : nullptr, send ? bytes : 0, send ? nullptr : buf, send ? 0 : bytes,
               file, line};
  Fail fail = Fail::kNo;
  if (const ncclResult_t rc = begin(c, &fail); rc != ncclSuccess) return rc;
  P2p op{send, comm, buf, count, datatype, peer, fail == Fail::kAsync};
  if (t_group_depth > 0) {
    t_p2p.push_back(op);
    return ncclSuccess;
  }
  return run_p2p({op});
}

}  // namespace

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream, const char* file, int line) {
  // MPI_Isend takes a const buffer: the cast only lets P2p hold both kinds.
  return p2p(true, const_cast<void*>(sendbuff), count, datatype, peer, comm, stream, file, line);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream, const char* file, int line) {
  return p2p(false, recvbuff, count, datatype, peer, comm, stream, file, line);
}

// ---- communicators ----------------------------------------------------------------------

namespace {

// The emulation's own copy of MPI_COMM_WORLD, so that its splits never
// interleave with the program's collectives on the world. Collective the first
// time, which is every rank's first ncclCommInitRank.
MPI_Comm world() {
  static MPI_Comm dup = [] {
    MPI_Comm c = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, &c);
    return c;
  }();
  return dup;
}

// What every member of a new group declares; all must agree.
struct Card {
  char id[NCCL_UNIQUE_ID_BYTES];
  int nranks;
  int rank;
  int usable;  // a place to put the communicator
};

// Why the group that `mine` landed in is not a communicator, or "".
std::string disagreement(const std::vector<Card>& cards, const Card& mine) {
  const int size = static_cast<int>(cards.size());
  for (int i = 0; i < size; ++i) {
    const Card& c = cards[i];
    if (std::memcmp(c.id, mine.id, sizeof c.id) != 0)
      return "two different unique ids met (their first 31 bits are equal)";
    if (!c.usable) return "a member passed comm = nullptr";
    if (c.nranks != mine.nranks)
      return "members passed nranks " + std::to_string(mine.nranks) + " and " +
             std::to_string(c.nranks);
  }
  if (size != mine.nranks)
    return std::to_string(size) + " ranks passed this id with nranks = " +
           std::to_string(mine.nranks);
  for (int i = 0; i < size; ++i)
    if (cards[i].rank != i)
      return "the ranks passed are not 0.." + std::to_string(size - 1) + " once each (" +
             std::to_string(cards[i].rank) + " where " + std::to_string(i) + " was expected)";
  return "";
}

}  // namespace

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return ncclInvalidArgument;
  std::random_device rd;
  for (size_t i = 0; i < sizeof id->internal; i += 4) {
    const uint32_t r = rd();
    std::memcpy(id->internal + i, &r, std::min<size_t>(4, sizeof id->internal - i));
  }
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  if (!initialised || finalised) {
    warn("ncclCommInitRank: the emulation runs over MPI, which is not initialised");
    return ncclInvalidUsage;
  }
  // Every member takes part in the split and the check, even one with bad
  // arguments, so that the group fails together instead of hanging.
  uint32_t color = 0;
  std::memcpy(&color, id.internal, sizeof color);
  MPI_Comm sub = MPI_COMM_NULL;
  if (MPI_Comm_split(world(), static_cast<int>(color & 0x7fffffffu), rank, &sub) != MPI_SUCCESS) {
    warn("ncclCommInitRank: MPI_Comm_split failed");
    return ncclSystemError;
  }
  Card mine{};
  std::memcpy(mine.id, id.internal, sizeof mine.id);
  mine.nranks = nranks;
  mine.rank = rank;
  mine.usable = comm != nullptr;
  int size = 0, me = 0;
  MPI_Comm_size(sub, &size);
  MPI_Comm_rank(sub, &me);
  std::vector<Card> cards(static_cast<size_t>(size));
  MPI_Allgather(&mine, sizeof mine, MPI_BYTE, cards.data(), sizeof mine, MPI_BYTE, sub);
  if (const std::string why = disagreement(cards, mine); !why.empty()) {
    warn("ncclCommInitRank(nranks " + std::to_string(nranks) + ", rank " + std::to_string(rank) +
         "): " + why);
    MPI_Comm_free(&sub);
    return ncclInvalidUsage;
  }
  MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
  auto* c = new ncclComm;
  c->mpi = sub;
  c->rank = rank;
  c->nranks = nranks;
  std::lock_guard lock(g_mu);
  g_comms.insert(c);
  *comm = c;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (const ncclResult_t rc = check_comm(comm, "ncclCommDestroy"); rc != ncclSuccess) return rc;
  {
    std::lock_guard lock(g_mu);
    g_comms.erase(comm);
  }
  MPI_Comm_free(&comm->mpi);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  std::lock_guard lock(g_mu);
  if (!comm || !g_comms.count(comm)) return ncclInvalidArgument;
  // The MPI communicator is left alone: a peer may still be inside a
  // collective on it, and freeing it here could hang. It leaks, once.
  comm->aborted = true;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  if (!error) return ncclInvalidArgument;
  std::lock_guard lock(g_mu);
  if (!comm || !g_comms.count(comm)) return ncclInvalidArgument;
  *error = comm->async_error.load();
  return ncclSuccess;
}

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return ncclInvalidArgument;
  *version = 22800;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++t_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (t_group_depth == 0) {
    warn("ncclGroupEnd without ncclGroupStart");
    return ncclInvalidUsage;
  }
  if (--t_group_depth > 0 || t_p2p.empty()) return ncclSuccess;
  std::vector<P2p> ops;
  ops.swap(t_p2p);
  return run_p2p(ops);
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (emulated NCCL: see stderr)";
    case ncclSystemError: return "unhandled system error (emulated NCCL: see stderr)";
    case ncclInternalError: return "internal error (emulated NCCL: see stderr)";
    case ncclInvalidArgument: return "invalid argument (emulated NCCL: see stderr)";
    case ncclInvalidUsage: return "invalid usage (emulated NCCL: see stderr)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
  }
  return "unknown result code";
}

void amsp::emu::nccl_set_timeout(double seconds) { g_timeout_s = seconds > 0 ? seconds : 0; }
