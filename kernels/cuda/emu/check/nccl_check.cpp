// The emulated NCCL (kernels/cuda/emu/nccl.cpp) under mpiexec -n 4: every op
// in fp32, bf16, int32 and fp64, out of place and in place, on the world and on two
// generations of groups of 2, against references computed here; sums must be
// the rank-order sums (bf16: in fp32, rounded once) bit for bit on every rank.
// ncclSend and ncclRecv: an all-to-all as one group of a send to and a receive
// from every rank (itself included), messages between two ranks matched in
// issue order, and a send and a receive outside any group. Then the error
// paths: a group whose members disagree fails on all of them, an aborted
// communicator refuses work, a peer outside the communicator is refused, a
// late peer times out a collective and a group of sends and receives, ranks
// that disagree on a count hang until the timeout. With AMSP_EMU_NCCL_FAIL set it checks
// instead that the injected failure happens where asked.
//
// Not a gtest program: it needs MPI and 4 ranks (emu/tests.cmake runs it).
// Prints "<n> failed" on rank 0.
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kernels/common/math.h"
#include "kernels/cuda/api.h"

namespace {

using Bytes = std::vector<char>;

int g_failed = 0;
int g_world_rank = 0;

void expect(bool ok, const std::string& what) {
  if (ok) return;
  ++g_failed;
  std::fprintf(stderr, "nccl_check: rank %d: FAILED: %s\n", g_world_rank, what.c_str());
}

struct Group {
  std::string name;
  int rank = 0, size = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

// A communicator over the ranks of `mpi`, made the way NcclCommunicator does.
Group make_group(MPI_Comm mpi, const std::string& name) {
  Group g;
  g.name = name;
  MPI_Comm_rank(mpi, &g.rank);
  MPI_Comm_size(mpi, &g.size);
  ncclUniqueId id{};
  if (g.rank == 0) ncclGetUniqueId(&id);
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, mpi);
  expect(ncclCommInitRank(&g.comm, g.size, id, g.rank) == ncclSuccess, name + ": init");
  cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking);
  return g;
}

void free_group(Group& g) {
  expect(ncclCommDestroy(g.comm) == ncclSuccess, g.name + ": destroy");
  cudaStreamDestroy(g.stream);
}

// ---- data and references --------------------------------------------------------------

const char* type_name(ncclDataType_t t) {
  switch (t) {
    case ncclInt32: return "int32";
    case ncclFloat32: return "fp32";
    case ncclFloat64: return "fp64";
    case ncclBfloat16: return "bf16";
  }
  return "?";
}

size_t type_bytes(ncclDataType_t t) { return t == ncclBfloat16 ? 2 : t == ncclFloat64 ? 8 : 4; }

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Group rank r's input: n values spread over 2^-10 .. 2^10 so that the order
// of summation shows in the last bits.
Bytes input(ncclDataType_t t, int r, size_t n, uint64_t salt) {
  Bytes b(n * type_bytes(t));
  for (size_t i = 0; i < n; ++i) {
    const uint64_t x = mix(salt * 1000003 + static_cast<uint64_t>(r) * 7919 + i);
    const double v = std::ldexp((static_cast<double>(x % 2000001) - 1e6) / 1e6,
                                static_cast<int>((x >> 32) % 21) - 10);
    char* at = b.data() + i * type_bytes(t);
    if (t == ncclFloat32) {
      const float f = static_cast<float>(v);
      std::memcpy(at, &f, 4);
    }
    if (t == ncclFloat64) std::memcpy(at, &v, 8);
    if (t == ncclInt32) {
      const int32_t k = static_cast<int32_t>(x >> 7);
      std::memcpy(at, &k, 4);
    }
    if (t == ncclBfloat16) {
      const uint16_t h = amsp::kernels::float_to_bf16(static_cast<float>(v));
      std::memcpy(at, &h, 2);
    }
  }
  return b;
}

// Element i of the sum of parts[order[0]], parts[order[1]], ... (each from
// element offset `off`), accumulated as the emulation promises.
void sum_element(ncclDataType_t t, const std::vector<Bytes>& parts, const std::vector<int>& order,
                 size_t off, size_t i, char* out) {
  const size_t eb = type_bytes(t), at = (off + i) * eb;
  if (t == ncclFloat32 || t == ncclBfloat16) {
    float acc = 0;
    for (size_t k = 0; k < order.size(); ++k) {
      const char* p = parts[order[k]].data() + at;
      float v;
      if (t == ncclFloat32) {
        std::memcpy(&v, p, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, p, 2);
        v = amsp::kernels::bf16_to_float(h);
      }
      acc = k == 0 ? v : acc + v;
    }
    if (t == ncclFloat32)
      std::memcpy(out, &acc, 4);
    else {
      const uint16_t h = amsp::kernels::float_to_bf16(acc);
      std::memcpy(out, &h, 2);
    }
  } else if (t == ncclFloat64) {
    double acc = 0;
    for (size_t k = 0; k < order.size(); ++k) {
      double v;
      std::memcpy(&v, parts[order[k]].data() + at, 8);
      acc = k == 0 ? v : acc + v;
    }
    std::memcpy(out, &acc, 8);
  } else {
    uint32_t acc = 0;
    for (int r : order) {
      int32_t v;
      std::memcpy(&v, parts[r].data() + at, 4);
      acc += static_cast<uint32_t>(v);
    }
    const int32_t s = static_cast<int32_t>(acc);
    std::memcpy(out, &s, 4);
  }
}

int64_t g_order_matters = 0;  // elements whose reversed-order sum has other bits

// The rank-order sum of count elements of every rank's part from `off`.
Bytes reference_sum(ncclDataType_t t, const std::vector<Bytes>& parts, size_t off, size_t count) {
  const size_t eb = type_bytes(t);
  std::vector<int> order(parts.size()), reversed(parts.size());
  for (size_t r = 0; r < parts.size(); ++r) order[r] = reversed[parts.size() - 1 - r] = int(r);
  Bytes out(count * eb), other(eb);
  for (size_t i = 0; i < count; ++i) {
    sum_element(t, parts, order, off, i, out.data() + i * eb);
    sum_element(t, parts, reversed, off, i, other.data());
    g_order_matters += std::memcmp(other.data(), out.data() + i * eb, eb) != 0;
  }
  return out;
}

std::vector<Bytes> all_inputs(ncclDataType_t t, const Group& g, size_t n, uint64_t salt) {
  std::vector<Bytes> parts;
  for (int r = 0; r < g.size; ++r) parts.push_back(input(t, r, n, salt));
  return parts;
}

// ---- device buffers ---------------------------------------------------------------------

char* device(size_t bytes) {
  void* p = nullptr;
  expect(cudaMalloc(&p, bytes) == cudaSuccess, "cudaMalloc");
  return static_cast<char*>(p);
}

void upload(char* d, const Bytes& b) {
  expect(cudaMemcpy(d, b.data(), b.size(), cudaMemcpyHostToDevice) == cudaSuccess, "upload");
}

Bytes download(const Group& g, const char* d, size_t bytes) {
  Bytes b(bytes);
  expect(cudaStreamSynchronize(g.stream) == cudaSuccess, "sync");  // before the legacy stream reads
  expect(cudaMemcpy(b.data(), d, bytes, cudaMemcpyDeviceToHost) == cudaSuccess, "download");
  return b;
}

// ---- the ops ----------------------------------------------------------------------------

std::string label(const Group& g, const char* op, ncclDataType_t t, size_t n, bool in_place) {
  return g.name + " " + op + " " + type_name(t) + " count " + std::to_string(n) +
         (in_place ? " in place" : "");
}

void check_all_reduce(const Group& g, ncclDataType_t t, size_t n, bool in_place, uint64_t salt) {
  const size_t bytes = n * type_bytes(t);
  const auto parts = all_inputs(t, g, n, salt);
  char* send = device(bytes);
  char* recv = in_place ? send : device(bytes);
  upload(send, parts[g.rank]);
  const std::string what = label(g, "all-reduce", t, n, in_place);
  expect(ncclAllReduce(send, recv, n, t, ncclSum, g.comm, g.stream) == ncclSuccess, what);
  expect(download(g, recv, bytes) == reference_sum(t, parts, 0, n), what + ": values");
  cudaFree(send);
  if (!in_place) cudaFree(recv);
}

void check_reduce_scatter(const Group& g, ncclDataType_t t, size_t n, bool in_place,
                          uint64_t salt) {
  const size_t bytes = n * type_bytes(t);
  const auto parts = all_inputs(t, g, n * g.size, salt);
  char* send = device(bytes * g.size);
  char* recv = in_place ? send + g.rank * bytes : device(bytes);
  upload(send, parts[g.rank]);
  const std::string what = label(g, "reduce-scatter", t, n, in_place);
  expect(ncclReduceScatter(send, recv, n, t, ncclSum, g.comm, g.stream) == ncclSuccess, what);
  expect(download(g, recv, bytes) == reference_sum(t, parts, g.rank * n, n), what + ": values");
  cudaFree(send);
  if (!in_place) cudaFree(recv);
}

void check_all_gather(const Group& g, ncclDataType_t t, size_t n, bool in_place, uint64_t salt) {
  const size_t bytes = n * type_bytes(t);
  const auto parts = all_inputs(t, g, n, salt);
  char* recv = device(bytes * g.size);
  char* send = in_place ? recv + g.rank * bytes : device(bytes);
  upload(send, parts[g.rank]);
  const std::string what = label(g, "all-gather", t, n, in_place);
  expect(ncclAllGather(send, recv, n, t, g.comm, g.stream) == ncclSuccess, what);
  Bytes want;
  for (const Bytes& p : parts) want.insert(want.end(), p.begin(), p.end());
  expect(download(g, recv, bytes * g.size) == want, what + ": values");
  cudaFree(recv);
  if (!in_place) cudaFree(send);
}

void check_broadcast(const Group& g, ncclDataType_t t, size_t n, bool in_place, uint64_t salt) {
  const size_t bytes = n * type_bytes(t);
  const int root = static_cast<int>(salt % g.size);
  const auto parts = all_inputs(t, g, n, salt);
  char* send = device(bytes);
  char* recv = in_place ? send : device(bytes);
  upload(send, parts[g.rank]);
  const std::string what = label(g, "broadcast", t, n, in_place) + " root " + std::to_string(root);
  expect(ncclBroadcast(send, recv, n, t, root, g.comm, g.stream) == ncclSuccess, what);
  expect(download(g, recv, bytes) == parts[root], what + ": values");
  cudaFree(send);
  if (!in_place) cudaFree(recv);
}

// An all-to-all as NCCL's users write it: in one group, block p of send goes
// to rank p and block p of recv comes from it, this rank included. Rank r's
// input is parts[r]: block p of what this rank gets is block `rank` of parts[p].
void check_all_to_all(const Group& g, ncclDataType_t t, size_t n, uint64_t salt) {
  const size_t bytes = n * type_bytes(t);
  const auto parts = all_inputs(t, g, n * g.size, salt);
  char* send = device(bytes * g.size);
  char* recv = device(bytes * g.size);
  upload(send, parts[g.rank]);
  const std::string what = label(g, "all-to-all (send/recv)", t, n, false);
  bool ok = ncclGroupStart() == ncclSuccess;
  for (int p = 0; p < g.size; ++p) {
    ok &= ncclSend(send + p * bytes, n, t, p, g.comm, g.stream) == ncclSuccess;
    ok &= ncclRecv(recv + p * bytes, n, t, p, g.comm, g.stream) == ncclSuccess;
  }
  ok &= ncclGroupEnd() == ncclSuccess;
  expect(ok, what);
  Bytes want;
  for (const Bytes& p : parts) want.insert(want.end(), p.begin() + g.rank * bytes, p.begin() + (g.rank + 1) * bytes);
  expect(download(g, recv, bytes * g.size) == want, what + ": values");
  cudaFree(send);
  cudaFree(recv);
}

// Between two ranks, messages match in issue order: three sends of different
// sizes to the next rank, in a nested group, land in three receives in the
// same order (sizes that did not match would fail or truncate). Then one send
// and one receive outside any group, each an operation of its own: even ranks
// send first, odd ranks receive first.
void check_p2p_order(const Group& g, uint64_t salt) {
  const ncclDataType_t t = ncclFloat32;
  const int next = (g.rank + 1) % g.size, prev = (g.rank + g.size - 1) % g.size;
  const size_t sizes[3] = {3, 1, 700};
  std::vector<Bytes> mine, theirs;
  for (size_t k = 0; k < 3; ++k) {
    mine.push_back(input(t, g.rank, sizes[k], salt + k));
    theirs.push_back(input(t, prev, sizes[k], salt + k));
  }
  std::vector<char*> out, in;
  bool ok = ncclGroupStart() == ncclSuccess && ncclGroupStart() == ncclSuccess;
  for (size_t k = 0; k < 3; ++k) {
    out.push_back(device(mine[k].size()));
    in.push_back(device(theirs[k].size()));
    upload(out[k], mine[k]);
    ok &= ncclRecv(in[k], sizes[k], t, prev, g.comm, g.stream) == ncclSuccess;
    ok &= ncclSend(out[k], sizes[k], t, next, g.comm, g.stream) == ncclSuccess;
    if (k == 0) ok &= ncclGroupEnd() == ncclSuccess;  // closes the inner group only
  }
  ok &= ncclGroupEnd() == ncclSuccess;
  expect(ok, g.name + " three sends to the next rank in a group");
  for (size_t k = 0; k < 3; ++k) {
    expect(download(g, in[k], theirs[k].size()) == theirs[k],
           g.name + " send/recv in issue order, message " + std::to_string(k));
    cudaFree(out[k]);
    cudaFree(in[k]);
  }
  if (g.size < 2) return;
  const int peer = g.rank ^ 1;  // pairs (0, 1), (2, 3)
  if (peer >= g.size) return;
  const Bytes m = input(t, g.rank, 9, salt + 5), want = input(t, peer, 9, salt + 5);
  char* a = device(m.size());
  char* b = device(m.size());
  upload(a, m);
  ok = true;
  for (int step = 0; step < 2; ++step) {
    if ((step == 0) == (g.rank % 2 == 0)) ok &= ncclSend(a, 9, t, peer, g.comm, g.stream) == ncclSuccess;
    else ok &= ncclRecv(b, 9, t, peer, g.comm, g.stream) == ncclSuccess;
  }
  expect(ok && download(g, b, m.size()) == want, g.name + " a send and a receive outside a group");
  cudaFree(a);
  cudaFree(b);
}

void check_ops(const Group& g) {
  uint64_t salt = 1;
  for (ncclDataType_t t : {ncclFloat32, ncclBfloat16, ncclInt32, ncclFloat64})
    for (size_t n : {size_t{0}, size_t{1}, size_t{5}, size_t{1003}}) {
      for (bool in_place : {false, true}) {
        check_all_reduce(g, t, n, in_place, ++salt);
        check_reduce_scatter(g, t, n, in_place, ++salt);
        check_all_gather(g, t, n, in_place, ++salt);
        check_broadcast(g, t, n, in_place, ++salt);
      }
      check_all_to_all(g, t, n, ++salt);
    }
  // Blocks far above MPI's eager limit: a send that ran at its call instead of
  // at the group's end would wait for a receive not yet posted (for its own
  // block at once); the timeout turns that hang into a failure.
  amsp::emu::nccl_set_timeout(5);
  check_all_to_all(g, ncclFloat32, 100000, ++salt);
  amsp::emu::nccl_set_timeout(0);
  check_p2p_order(g, ++salt);
}

// ---- error paths ------------------------------------------------------------------------

void check_errors(int world_size) {
  // Members that disagree on nranks all fail, none hangs.
  ncclUniqueId id{};
  if (g_world_rank == 0) ncclGetUniqueId(&id);
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t bad = nullptr;
  expect(ncclCommInitRank(&bad, world_size + 1, id, g_world_rank) == ncclInvalidUsage,
         "init with the wrong nranks fails");

  Group g = make_group(MPI_COMM_WORLD, "aborted");
  std::vector<float> host(4);
  char* d = device(16);
  expect(ncclAllReduce(host.data(), host.data(), 4, ncclFloat32, ncclSum, g.comm, g.stream) ==
             ncclInvalidArgument,
         "host buffers are refused");
  expect(ncclGroupEnd() == ncclInvalidUsage, "ncclGroupEnd without start");
  expect(ncclGroupStart() == ncclSuccess, "ncclGroupStart");
  expect(ncclAllReduce(d, d, 0, ncclFloat32, ncclSum, g.comm, g.stream) == ncclSuccess,
         "an op inside a group");
  expect(ncclGroupEnd() == ncclSuccess, "ncclGroupEnd");
  expect(ncclSend(d, 1, ncclFloat32, world_size, g.comm, g.stream) == ncclInvalidArgument &&
             ncclRecv(d, 1, ncclFloat32, -1, g.comm, g.stream) == ncclInvalidArgument,
         "a peer outside the communicator is refused");
  expect(ncclCommAbort(g.comm) == ncclSuccess, "abort");
  expect(ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, g.comm, g.stream) == ncclInvalidUsage,
         "an aborted communicator refuses work");
  ncclResult_t async = ncclInternalError;
  expect(ncclCommGetAsyncError(g.comm, &async) == ncclSuccess && async == ncclSuccess,
         "no async error after abort");
  expect(std::string(ncclGetErrorString(ncclRemoteError)).find("remote") != std::string::npos,
         "error string");
  cudaStreamSynchronize(g.stream);
  cudaFree(d);
  cudaStreamDestroy(g.stream);
}

// With a timeout, an op whose peer comes late returns ncclRemoteError: a
// broadcast from rank 0, then a group of a send to the next rank and a receive
// from the previous one, where only rank 1 waits for rank 0.
void check_timeout() {
  Group g = make_group(MPI_COMM_WORLD, "late");
  amsp::emu::nccl_set_timeout(0.5);
  char* d = device(16);
  char* p2p = device(8);
  if (g.rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const ncclResult_t rc = ncclBroadcast(d, d, 4, ncclFloat32, 0, g.comm, g.stream);
  ncclResult_t async = ncclSuccess;
  ncclCommGetAsyncError(g.comm, &async);
  if (g.rank != 0)
    expect(rc == ncclRemoteError && async == ncclRemoteError, "a late peer times the op out");
  ncclGroupStart();
  ncclSend(p2p, 1, ncclFloat32, (g.rank + 1) % g.size, g.comm, g.stream);
  ncclRecv(p2p + 4, 1, ncclFloat32, (g.rank + g.size - 1) % g.size, g.comm, g.stream);
  const ncclResult_t group = ncclGroupEnd();
  if (g.rank != 0)
    expect(group == (g.rank == 1 ? ncclRemoteError : ncclSuccess),
           "a receive from a late peer times its group out, the others complete");
  amsp::emu::nccl_set_timeout(0);
  MPI_Barrier(MPI_COMM_WORLD);  // the root's message is delivered; nothing is left pending
  ncclCommAbort(g.comm);
  cudaStreamSynchronize(g.stream);
  cudaFree(d);
  cudaFree(p2p);
  cudaStreamDestroy(g.stream);
}

// Ranks that call a collective with different counts hang in it, as NCCL's
// would, until the timeout, which then fails it on every rank.
void check_mismatch() {
  Group g = make_group(MPI_COMM_WORLD, "mismatched");
  amsp::emu::nccl_set_timeout(0.5);
  char* send = device(64);
  char* recv = device(64 * g.size);
  const size_t n = g.rank == 1 ? 5 : 4;
  const auto t0 = std::chrono::steady_clock::now();
  const ncclResult_t rc = ncclAllGather(send, recv, n, ncclFloat32, g.comm, g.stream);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ncclResult_t async = ncclSuccess;
  ncclCommGetAsyncError(g.comm, &async);
  expect(rc == ncclRemoteError && async == ncclRemoteError && waited >= 0.45,
         "ranks that disagree on a count hang in the op until the timeout");
  amsp::emu::nccl_set_timeout(0);
  ncclCommAbort(g.comm);
  cudaStreamSynchronize(g.stream);
  cudaFree(send);
  cudaFree(recv);
  cudaStreamDestroy(g.stream);
}

// AMSP_EMU_NCCL_FAIL=allreduce:<n>[:async]: calls 1..n-1 succeed, call n fails
// as asked.
void check_injection(const std::string& spec) {
  const size_t c1 = spec.find(':');
  const long nth = std::atol(spec.c_str() + c1 + 1);
  const bool async = spec.find(":async") != std::string::npos;
  expect(spec.substr(0, c1) == "allreduce" && nth >= 1, "nccl_check knows allreduce:<n> only");
  Group g = make_group(MPI_COMM_WORLD, "injected");
  char* d = device(16);
  for (long k = 1; k < nth; ++k)
    expect(ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, g.comm, g.stream) == ncclSuccess,
           "calls before the injected one");
  const ncclResult_t rc = ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, g.comm, g.stream);
  ncclResult_t err = ncclSuccess;
  expect(ncclCommGetAsyncError(g.comm, &err) == ncclSuccess, "ncclCommGetAsyncError");
  if (async) {
    expect(rc == ncclSuccess && err == ncclRemoteError, "async injected failure");
  } else {
    expect(rc == ncclSystemError && err == ncclSuccess, "injected failure");
  }
  cudaStreamSynchronize(g.stream);
  cudaFree(d);
  free_group(g);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int devices = 1;
  cudaGetDeviceCount(&devices);
  cudaSetDevice(g_world_rank % devices);
  const char* inject = std::getenv("AMSP_EMU_NCCL_FAIL");
  if (inject && *inject) {
    check_injection(inject);
  } else {
    expect(size >= 3 && size % 2 == 0, "run with an even number of ranks >= 4 (mpiexec -n 4)");
    Group world = make_group(MPI_COMM_WORLD, "world");
    check_ops(world);
    expect(g_order_matters > 0, "the data makes the order of summation show");
    // Two generations of groups of 2, created in the same order on every rank.
    MPI_Comm pairs = MPI_COMM_NULL, strided = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, g_world_rank / 2, g_world_rank, &pairs);
    MPI_Comm_split(MPI_COMM_WORLD, g_world_rank % 2, g_world_rank, &strided);
    Group pair = make_group(pairs, "pairs"), stride = make_group(strided, "strided");
    check_ops(pair);
    check_ops(stride);
    free_group(pair);
    free_group(stride);
    free_group(world);
    check_errors(size);
    check_timeout();
    check_mismatch();
    MPI_Comm_free(&pairs);
    MPI_Comm_free(&strided);
  }
  int failed = 0;
  MPI_Allreduce(&g_failed, &failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_world_rank == 0) std::printf("nccl_check: %d ranks, %d failed\n", size, failed);
  MPI_Finalize();
  return failed ? 1 : 0;
}
