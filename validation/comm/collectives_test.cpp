// MPI system test of the communication layer (run under mpiexec -n 3 and -n 4):
// every collective against a straightforward reference on random data, sizes
// that do not split evenly (padding) and zero-length ones, issue-order
// completion, groups built from a shard plan's mesh, concurrent groups, and
// the accounting against traffic_bytes; the same in bf16 against a reference
// written here (the fp32 sum in rank order, rounded once), int32 moves, and
// the accounting per dtype. all-to-all in fp32, bf16 and int32 on groups of
// every size up to the world's, chained after an op of another communicator,
// on the MPI backend and (progress thread only) on the NCCL backend over the
// emulated NCCL. Prints "N passed, M failed".
//
// With --wire DIR it only runs a fixed set of ops of every dtype, one group per
// (dtype, op), and writes each rank's accounting to DIR/amsp-rank-<r>.json, for
// validation/comm/wire_dtype_test.py to compare with what MPI was handed.

#include <mpi.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/group.h"
#include "comm/nccl/nccl_communicator.h"
#include "comm/traffic.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/test_rank_checks.h"
#include "engine/plan_groups.h"
#include "plan/mesh.h"
#include "plan/shard_plan.h"

using namespace amsp;
using comm::Op;

namespace {

int g_rank = 0, g_world = 1;
test::RankChecks g_checks;

void check(bool ok, const std::string& what) { g_checks.check(ok, what); }

// The data group rank r contributes for a given case: reproducible anywhere.
std::vector<float> data_of(uint64_t seed, int r, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t s = seed * 1000003u + static_cast<uint64_t>(r) * 7919u + 1;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<int64_t>((s >> 33) % 2001) - 1000) / 256.0f;
  }
  return v;
}

bool close(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  if (got.size() != want.size()) return false;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::fabs(got[i] - want[i]) > tol * (1 + std::fabs(want[i]))) return false;
  return true;
}

// Every op once on `c` with count elements (per rank for all-gather and
// reduce-scatter), against the reference.
void check_ops(comm::Communicator& c, int64_t count, uint64_t seed) {
  const int n = c.size(), me = c.rank();
  const auto label = [&](Op op) {
    return cat(comm::op_name(op), " on ", c.name(), " (", n, " ranks), count ", count);
  };
  {  // all-gather, out of place and in place
    const auto mine = data_of(seed, me, count);
    std::vector<float> recv(static_cast<size_t>(count * n), -1.0f);
    c.all_gather(mine.data(), count, recv.data()).wait();
    std::vector<double> want;
    for (int r = 0; r < n; ++r)
      for (float x : data_of(seed, r, count)) want.push_back(x);
    check(close(recv, want, 0), label(Op::kAllGather));
    std::vector<float> inplace(static_cast<size_t>(count * n), -1.0f);
    std::copy(mine.begin(), mine.end(), inplace.begin() + count * me);
    c.all_gather(inplace.data() + count * me, count, inplace.data()).wait();
    check(close(inplace, want, 0), label(Op::kAllGather) + " in place");
  }
  {  // reduce-scatter
    const auto mine = data_of(seed + 1, me, count * n);
    std::vector<float> recv(static_cast<size_t>(count), -1.0f);
    c.reduce_scatter(mine.data(), count, recv.data()).wait();
    std::vector<double> want(static_cast<size_t>(count), 0.0);
    for (int r = 0; r < n; ++r) {
      const auto d = data_of(seed + 1, r, count * n);
      for (int64_t i = 0; i < count; ++i) want[i] += d[count * me + i];
    }
    check(close(recv, want, 1e-5), label(Op::kReduceScatter));
  }
  {  // all-reduce
    auto buf = data_of(seed + 2, me, count);
    c.all_reduce(buf.data(), count).wait();
    std::vector<double> want(static_cast<size_t>(count), 0.0);
    for (int r = 0; r < n; ++r) {
      const auto d = data_of(seed + 2, r, count);
      for (int64_t i = 0; i < count; ++i) want[i] += d[i];
    }
    check(close(buf, want, 1e-5), label(Op::kAllReduce));
  }
  for (int root : {0, n - 1}) {  // broadcast
    auto buf = me == root ? data_of(seed + 3, root, count) : std::vector<float>(count, -7.0f);
    c.broadcast(buf.data(), count, root).wait();
    std::vector<double> want;
    for (float x : data_of(seed + 3, root, count)) want.push_back(x);
    check(close(buf, want, 0), cat(label(Op::kBroadcast), " root ", root));
  }
}

// A buffer of `real` elements that does not split evenly: pad, reduce-scatter,
// update the shard, all-gather back, and compare the real part.
void check_padding(comm::Communicator& c, int64_t real, uint64_t seed) {
  const int n = c.size(), me = c.rank();
  const int64_t block = comm::block_count(real, n), padded = comm::padded_count(real, n);
  std::vector<float> grad(static_cast<size_t>(padded), 0.0f);
  const auto mine = data_of(seed, me, real);
  std::copy(mine.begin(), mine.end(), grad.begin());
  std::vector<float> shard(static_cast<size_t>(block));
  c.reduce_scatter(grad.data(), block, shard.data());
  std::vector<float> full(static_cast<size_t>(padded), -1.0f);
  // Issue order: the all-gather starts after the reduce-scatter filled shard.
  const comm::Handle h = c.all_gather(shard.data(), block, full.data());
  comm::Handle(h).wait();
  std::vector<double> want(static_cast<size_t>(real), 0.0);
  for (int r = 0; r < n; ++r) {
    const auto d = data_of(seed, r, real);
    for (int64_t i = 0; i < real; ++i) want[i] += d[i];
  }
  full.resize(static_cast<size_t>(real));
  check(close(full, want, 1e-5), cat("padded reduce-scatter + all-gather of ", real,
                                     " elements on ", c.name(), " (", n, " ranks)"));
  const comm::Span s = comm::real_part_of_block(real, n, me);
  bool tail_zero = true;
  for (int64_t i = s.length; i < block; ++i) tail_zero &= shard[i] == 0.0f;
  check(tail_zero, cat("padding of block ", me, " stays zero (", real, " elements)"));
}

// Waiting on the last of a chain of dependent ops implies the earlier ones are
// done, and each op saw its predecessor's result.
void check_issue_order(comm::Communicator& c) {
  const int n = c.size(), me = c.rank();
  const int64_t count = 100000;
  std::vector<float> buf(static_cast<size_t>(count), static_cast<float>(me + 1));
  std::vector<comm::Handle> hs;
  for (int k = 0; k < 6; ++k) hs.push_back(c.all_reduce(buf.data(), count));
  hs.back().wait();
  bool all_done = true;
  for (auto& h : hs) all_done &= h.test();
  check(all_done, cat("waiting on the last op completes the earlier ones on ", c.name()));
  // Each all-reduce multiplies by n: (sum of 1..n) * n^5.
  double want = n * (n + 1) / 2.0;
  for (int k = 1; k < 6; ++k) want *= n;
  bool ok = true;
  for (float x : buf) ok &= std::fabs(x - want) <= 1e-5 * want;
  check(ok, cat("six chained all-reduces run in issue order on ", c.name()));
  for (size_t k = 1; k < hs.size(); ++k) check(hs[k].sequence() == hs[k - 1].sequence() + 1, "sequence numbers");
}

// The accounting equals the bandwidth-optimal model, written out here for
// each op (not through comm::traffic_bytes, which the accounting itself uses):
// all-gather, reduce-scatter and all-to-all move (n-1) blocks of the per-rank
// count, an all-reduce 2(n-1) blocks of ceil(count/n), a broadcast's root sends
// the buffer once and every other rank receives it; 4-byte floats.
void check_accounting(comm::Communicator& c) {
  c.reset_stats();
  const int64_t n = c.size(), me = c.rank(), root = n - 1;
  const int64_t counts[] = {0, 5, 1000, 1023};
  int64_t gather = 0, allreduce = 0, bcast = 0;
  for (int64_t k : counts) {
    std::vector<float> a(static_cast<size_t>(k * n), 1.0f), b(static_cast<size_t>(k * n), 0.0f);
    c.all_gather(a.data(), k, b.data());
    c.reduce_scatter(a.data(), k, b.data());
    c.all_reduce(a.data(), k);
    c.broadcast(a.data(), k, static_cast<int>(root));
    c.all_to_all(a.data(), k, b.data());
    c.synchronize();
    gather += (n - 1) * k * 4;
    allreduce += 2 * (n - 1) * ((k + n - 1) / n) * 4;
    bcast += n > 1 ? k * 4 : 0;
  }
  // {sent, received} per op on this rank; a group of one moves nothing. An
  // all-to-all sends a block to each other rank and keeps its own: (n-1) blocks.
  const int64_t want[5][2] = {{gather, gather},
                              {gather, gather},
                              {allreduce, allreduce},
                              {me == root ? bcast : 0, me == root ? 0 : bcast},
                              {gather, gather}};
  const comm::Stats got = c.stats();
  for (Op op : comm::kAllOps) {
    const auto* w = want[static_cast<int>(op)];
    check(got[op].calls == 4 && got[op].bytes_sent == w[0] && got[op].bytes_received == w[1],
          cat("stats of ", comm::op_name(op), " on ", c.name(), ": ", got[op].calls, " calls, ",
              got[op].bytes_sent, "/", got[op].bytes_received, " bytes, expected 4 calls, ", w[0], "/", w[1]));
    check(got[op].in_flight_s >= 0 && got[op].exposed_s >= 0 &&
              got[op].exposed_s <= got[op].in_flight_s + 0.5,
          cat("times of ", comm::op_name(op), " on ", c.name()));
  }
  // Summed over the group (c spans MPI_COMM_WORLD here): every rank counted its
  // calls, and the broadcast's bytes received are the root's sent times the n-1
  // receivers.
  const comm::Stats sum = comm::reduce_stats(got, MPI_COMM_WORLD);
  check(sum[Op::kAllGather].calls == 4 * n && sum[Op::kBroadcast].bytes_received ==
            (n - 1) * sum[Op::kBroadcast].bytes_sent,
        cat("stats summed over ", c.name(), ": ", sum[Op::kAllGather].calls, " all-gather calls, broadcast ",
            sum[Op::kBroadcast].bytes_sent, " sent / ", sum[Op::kBroadcast].bytes_received, " received"));
}

// --- bf16 and int32 ------------------------------------------------------------
// The test's own bf16: the bits are the top half of an fp32 (exact both ways
// for the values below), and rounding to nearest, ties to even, is done by
// comparing the distances to the two neighbours in double precision.
float bf16_value(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t bf16_nearest(float x) {  // finite x below bf16's largest value
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint16_t down = static_cast<uint16_t>(u >> 16);  // toward zero
  const uint16_t up = static_cast<uint16_t>(down + 1);   // away from zero
  const double d_down = std::fabs(static_cast<double>(x) - bf16_value(down));
  const double d_up = std::fabs(static_cast<double>(bf16_value(up)) - x);
  if (d_down != d_up) return d_down < d_up ? down : up;
  return (down & 1) == 0 ? down : up;
}

// Rank r's bf16 data for a case: signs and exponents over a wide range (2^-20
// .. 2^20), so that sums need more than bf16's 8 bits, and fp32 sums of them
// depend on the order of the additions.
std::vector<uint16_t> bf16_data_of(uint64_t seed, int r, int64_t n) {
  std::vector<uint16_t> v(static_cast<size_t>(n));
  uint64_t s = seed * 2654435761u + static_cast<uint64_t>(r) * 40503u + 17;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const uint32_t sign = static_cast<uint32_t>(s >> 63);
    const uint32_t exponent = 127 - 20 + static_cast<uint32_t>((s >> 40) % 41);
    const uint32_t mantissa = static_cast<uint32_t>((s >> 20) & 0x7f);
    x = static_cast<uint16_t>((sign << 15) | (exponent << 7) | mantissa);
  }
  return v;
}

// What a bf16 sum must give for element i: the fp32 sum over ranks 0..n-1 in
// that order of each rank's element, rounded once.
uint16_t bf16_reference_sum(const std::vector<std::vector<uint16_t>>& per_rank, int64_t i) {
  float s = 0.0f;
  for (const auto& d : per_rank) s += bf16_value(d[static_cast<size_t>(i)]);
  return bf16_nearest(s);
}

// Every op once in bf16 on `c` (group rank r contributes bf16_data_of(seed, r, ...)),
// compared bit for bit with the reference.
void check_ops_bf16(comm::Communicator& c, int64_t count, uint64_t seed) {
  const int n = c.size(), me = c.rank();
  const DType bf = DType::kBF16;
  const auto label = [&](Op op) {
    return cat("bf16 ", comm::op_name(op), " on ", c.name(), " (", n, " ranks), count ", count);
  };
  {  // all-gather, out of place and in place: the bits move unchanged
    const auto mine = bf16_data_of(seed, me, count);
    std::vector<uint16_t> want;
    for (int r = 0; r < n; ++r)
      for (uint16_t x : bf16_data_of(seed, r, count)) want.push_back(x);
    std::vector<uint16_t> recv(static_cast<size_t>(count * n), 0xffff);
    c.all_gather(mine.data(), count, recv.data(), bf).wait();
    check(recv == want, label(Op::kAllGather));
    std::vector<uint16_t> inplace(static_cast<size_t>(count * n), 0xffff);
    std::copy(mine.begin(), mine.end(), inplace.begin() + count * me);
    c.all_gather(inplace.data() + count * me, count, inplace.data(), bf).wait();
    check(inplace == want, label(Op::kAllGather) + " in place");
  }
  {  // reduce-scatter
    std::vector<std::vector<uint16_t>> all;
    for (int r = 0; r < n; ++r) all.push_back(bf16_data_of(seed + 1, r, count * n));
    std::vector<uint16_t> recv(static_cast<size_t>(count), 0xffff);
    c.reduce_scatter(all[me].data(), count, recv.data(), bf).wait();
    std::vector<uint16_t> want(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) want[i] = bf16_reference_sum(all, count * me + i);
    check(recv == want, label(Op::kReduceScatter));
  }
  {  // all-reduce: every rank holds the same bits, those of the reference
    std::vector<std::vector<uint16_t>> all;
    for (int r = 0; r < n; ++r) all.push_back(bf16_data_of(seed + 2, r, count));
    auto buf = all[me];
    c.all_reduce(buf.data(), count, bf).wait();
    std::vector<uint16_t> want(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) want[i] = bf16_reference_sum(all, i);
    check(buf == want, label(Op::kAllReduce));
  }
  for (int root : {0, n - 1}) {  // broadcast
    const auto data = bf16_data_of(seed + 3, root, count);
    auto buf = me == root ? data : std::vector<uint16_t>(static_cast<size_t>(count), 0xffff);
    c.broadcast(buf.data(), count, root, bf).wait();
    check(buf == data, cat(label(Op::kBroadcast), " root ", root));
  }
}

// bf16 gradients of `real` elements: padded reduce-scatter, then the all-gather
// of the reduced shards issued at once (issue order covers the multi-stage op).
void check_padding_bf16(comm::Communicator& c, int64_t real, uint64_t seed) {
  const int n = c.size(), me = c.rank();
  const int64_t block = comm::block_count(real, n), padded = comm::padded_count(real, n);
  std::vector<std::vector<uint16_t>> all;
  for (int r = 0; r < n; ++r) {
    auto d = bf16_data_of(seed, r, real);
    d.resize(static_cast<size_t>(padded), 0);  // +0.0
    all.push_back(d);
  }
  std::vector<uint16_t> shard(static_cast<size_t>(block), 0xffff);
  std::vector<uint16_t> full(static_cast<size_t>(padded), 0xffff);
  c.reduce_scatter(all[me].data(), block, shard.data(), DType::kBF16);
  c.all_gather(shard.data(), block, full.data(), DType::kBF16).wait();
  std::vector<uint16_t> want(static_cast<size_t>(padded));
  for (int64_t i = 0; i < padded; ++i) want[i] = bf16_reference_sum(all, i);
  check(full == want, cat("bf16 padded reduce-scatter + all-gather of ", real, " elements on ",
                          c.name(), " (", n, " ranks)"));
}

// int32 moves exactly; summing it is refused before anything is issued.
void check_int32(comm::Communicator& c, int64_t count) {
  const int n = c.size(), me = c.rank();
  const auto val = [](int r, int64_t i) {
    return static_cast<int32_t>(2000000011 - 1000003 * r - static_cast<int32_t>(i));
  };
  std::vector<int32_t> mine(static_cast<size_t>(count)), recv(static_cast<size_t>(count * n), -1);
  std::vector<int32_t> want;
  for (int64_t i = 0; i < count; ++i) mine[i] = val(me, i);
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < count; ++i) want.push_back(val(r, i));
  c.all_gather(mine.data(), count, recv.data(), DType::kI32).wait();
  check(recv == want, cat("int32 all_gather on ", c.name(), ", count ", count));
  std::vector<int32_t> buf = me == n - 1 ? mine : std::vector<int32_t>(static_cast<size_t>(count), 0);
  c.broadcast(buf.data(), count, n - 1, DType::kI32).wait();
  bool ok = true;
  for (int64_t i = 0; i < count; ++i) ok &= buf[i] == val(n - 1, i);
  check(ok, cat("int32 broadcast on ", c.name(), ", count ", count));

  const comm::Stats before = c.stats();
  std::string message;
  try {
    c.all_reduce(buf.data(), count, DType::kI32);
  } catch (const Error& e) {
    message = e.what();
  }
  check(message.find("all_reduce") != std::string::npos && message.find("int32") != std::string::npos &&
            message.find(c.name()) != std::string::npos,
        cat("an int32 all_reduce is refused with an error naming op, type and group: '", message, "'"));
  check(c.stats()[Op::kAllReduce].calls == before[Op::kAllReduce].calls,
        "a refused op is not counted");
}

// Bytes per dtype, against formulas written here: per element 4 bytes (fp32,
// int32) or 2 (bf16); all-gather, reduce-scatter and all-to-all move (n-1)
// blocks of the per-rank count, all-reduce 2(n-1) blocks of ceil(count/n),
// broadcast the buffer once (the root sends, the others receive). The totals
// per op are the sums over dtypes.
void check_accounting_by_dtype(comm::Communicator& c) {
  c.reset_stats();
  const int64_t n = c.size(), me = c.rank(), root = 0;
  const int64_t counts[] = {0, 1, 5, 1001};
  // want[op][dtype] = {calls, sent, received}
  int64_t want[5][3][3] = {};
  for (int64_t k : counts) {
    std::vector<uint32_t> a(static_cast<size_t>(k * n) + 1, 0), b(static_cast<size_t>(k * n) + 1, 0);
    for (DType t : {DType::kF32, DType::kBF16, DType::kI32}) {
      const int64_t e = t == DType::kBF16 ? 2 : 4;
      const int ti = static_cast<int>(t);
      const auto add = [&](Op op, int64_t sent, int64_t received) {
        int64_t* w = want[static_cast<int>(op)][ti];
        w[0] += 1;
        w[1] += n > 1 ? sent : 0;
        w[2] += n > 1 ? received : 0;
      };
      c.all_gather(a.data(), k, b.data(), t);
      add(Op::kAllGather, (n - 1) * k * e, (n - 1) * k * e);
      c.broadcast(a.data(), k, static_cast<int>(root), t);
      add(Op::kBroadcast, me == root ? k * e : 0, me == root ? 0 : k * e);
      c.all_to_all(a.data(), k, b.data(), t);
      add(Op::kAllToAll, (n - 1) * k * e, (n - 1) * k * e);
      if (t == DType::kI32) continue;
      c.reduce_scatter(a.data(), k, b.data(), t);
      add(Op::kReduceScatter, (n - 1) * k * e, (n - 1) * k * e);
      c.all_reduce(a.data(), k, t);
      add(Op::kAllReduce, 2 * (n - 1) * ((k + n - 1) / n) * e, 2 * (n - 1) * ((k + n - 1) / n) * e);
    }
    c.synchronize();  // before a and b go
  }
  const comm::Stats got = c.stats();
  for (Op op : comm::kAllOps) {
    int64_t calls = 0, sent = 0, received = 0;
    for (DType t : {DType::kF32, DType::kBF16, DType::kI32}) {
      const int64_t* w = want[static_cast<int>(op)][static_cast<int>(t)];
      const comm::Counters& g = got[op][t];
      check(g.calls == w[0] && g.bytes_sent == w[1] && g.bytes_received == w[2],
            cat("stats of ", dtype_name(t), " ", comm::op_name(op), " on ", c.name(), ": ", g.calls,
                " calls, ", g.bytes_sent, "/", g.bytes_received, " bytes; expected ", w[0], ", ", w[1],
                "/", w[2]));
      calls += w[0];
      sent += w[1];
      received += w[2];
    }
    check(got[op].calls == calls && got[op].bytes_sent == sent && got[op].bytes_received == received,
          cat("stats of ", comm::op_name(op), " on ", c.name(), ": totals are the sums over dtypes"));
  }
  // Summed over the job (c spans MPI_COMM_WORLD): per dtype too.
  const comm::Stats sum = comm::reduce_stats(got, MPI_COMM_WORLD);
  check(sum[Op::kAllReduce][DType::kBF16].calls == 4 * n &&
            sum[Op::kBroadcast][DType::kBF16].bytes_received ==
                (n - 1) * sum[Op::kBroadcast][DType::kBF16].bytes_sent &&
            sum[Op::kBroadcast][DType::kBF16].bytes_sent == (n > 1 ? (0 + 1 + 5 + 1001) * 2 : 0),
        cat("bf16 stats summed over ", c.name()));
  // The table has one row per (group, op, dtype) and a line of bytes by dtype.
  const std::string table = comm::format_stats({got});
  check(table.find("reduce_scatter  bf16") != std::string::npos &&
            table.find("broadcast       int32") != std::string::npos &&
            (n == 1 || table.find("sent by dtype: fp32 ") != std::string::npos),
        "format_stats shows the dtypes:\n" + table);
}

// --- all-to-all ------------------------------------------------------------------
// The same checks on both backends: buffers in host memory for MPI, in the
// emulated device memory for NCCL.
class Memory {
 public:
  explicit Memory(bool device) : device_(device) {}
  bool device() const { return device_; }
  // A buffer holding `bytes`.
  std::shared_ptr<void> make(const std::vector<uint8_t>& bytes) {
    const size_t size = std::max<size_t>(bytes.size(), 1);
    std::shared_ptr<void> p;
    if (device_) {
      void* d = nullptr;
      cudaMalloc(&d, size);
      p = std::shared_ptr<void>(d, [](void* q) { cudaFree(q); });
      cudaMemcpy(d, bytes.data(), bytes.size(), cudaMemcpyHostToDevice);
    } else {
      p = std::shared_ptr<void>(std::malloc(size), std::free);
      std::memcpy(p.get(), bytes.data(), bytes.size());
    }
    return p;
  }
  std::vector<uint8_t> read(const void* src, size_t bytes) {
    std::vector<uint8_t> out(bytes);
    if (device_) cudaMemcpy(out.data(), src, bytes, cudaMemcpyDeviceToHost);
    else std::memcpy(out.data(), src, bytes);
    return out;
  }

 private:
  bool device_;
};

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The bits of element i of the block group rank `from` sends to group rank
// `to`, appended to `out`: different for (almost) every (from, to, i), and
// finite numbers in fp32 and bf16 (int32: any bits, an opaque record's words).
void append_word(std::vector<uint8_t>& out, uint64_t seed, int from, int to, int64_t i, DType t) {
  const uint64_t h = splitmix(seed * 0x100000001b3ull ^ splitmix((uint64_t(from) << 48) ^
                                                                 (uint64_t(to) << 32) ^ uint64_t(i)));
  uint32_t w = static_cast<uint32_t>(h);
  if (t == DType::kF32)  // sign, exponent 2^-20 .. 2^20, any mantissa
    w = (w & 0x807fffffu) | ((127 - 20 + static_cast<uint32_t>((h >> 32) % 41)) << 23);
  if (t == DType::kBF16)
    w = (w & 0x807fu) | ((127 - 20 + static_cast<uint32_t>((h >> 32) % 41)) << 7);
  const auto* b = reinterpret_cast<const uint8_t*>(&w);
  out.insert(out.end(), b, b + dtype_bytes(t));  // little endian: the low bytes
}

std::string a2a_label(const comm::Communicator& c, DType t, int64_t count) {
  return cat(dtype_name(t), " all_to_all on ", c.name(), " (", c.backend(), ", ", c.size(),
             " ranks), count ", count);
}

// Every rank sends block j of its input to group rank j: block r of what this
// rank receives is what rank r made for it, bit for bit; the input is untouched.
void check_all_to_all(comm::Communicator& c, Memory& mem, int64_t count, DType t, uint64_t seed) {
  const int n = c.size(), me = c.rank();
  const size_t bytes = static_cast<size_t>(count * n * dtype_bytes(t));
  std::vector<uint8_t> mine, want;
  for (int to = 0; to < n; ++to)
    for (int64_t i = 0; i < count; ++i) append_word(mine, seed, me, to, i, t);
  for (int from = 0; from < n; ++from)
    for (int64_t i = 0; i < count; ++i) append_word(want, seed, from, me, i, t);
  auto send = mem.make(mine);
  auto recv = mem.make(std::vector<uint8_t>(bytes, 0xee));
  c.all_to_all(send.get(), count, recv.get(), t).wait();
  check(mem.read(recv.get(), bytes) == want && mem.read(send.get(), bytes) == mine,
        a2a_label(c, t, count));
}

// Overlapping buffers are refused on every rank before anything is issued or
// counted; count 0 moves nothing whatever the pointers.
void check_all_to_all_refused(comm::Communicator& c, Memory& mem) {
  const int n = c.size();
  auto buf = mem.make(std::vector<uint8_t>(static_cast<size_t>(8 * n * 4 + 4), 0));
  char* p = static_cast<char*>(buf.get());
  const comm::Stats before = c.stats();
  for (char* recv : {p, p + 4}) {
    std::string message;
    try {
      c.all_to_all(p, 8, recv, DType::kI32);
    } catch (const Error& e) {
      message = e.what();
    }
    check(message.find("all_to_all") != std::string::npos && message.find("overlap") != std::string::npos &&
              message.find(c.name()) != std::string::npos,
          cat("an all_to_all into its own input is refused on ", c.name(), " (", c.backend(), "): '", message, "'"));
  }
  c.all_to_all(p, 0, p, DType::kI32).wait();
  check(c.stats()[Op::kAllToAll].calls == before[Op::kAllToAll].calls + 1,
        cat("refused all_to_alls are not counted on ", c.name()));
}

// all-to-all in every dtype and count on c, then its accounting per dtype
// against (n-1) blocks of count x element size, written out here.
void check_all_to_all_cases(comm::Communicator& c, Memory& mem, const std::vector<int64_t>& counts,
                          uint64_t seed) {
  c.reset_stats();
  const int64_t n = c.size();
  std::array<int64_t, kNumDTypes> calls{}, bytes{};
  for (DType t : {DType::kF32, DType::kBF16, DType::kI32})
    for (int64_t k : counts) {
      check_all_to_all(c, mem, k, t, seed += 10);
      calls[static_cast<int>(t)] += 1;
      bytes[static_cast<int>(t)] += (n - 1) * k * (t == DType::kBF16 ? 2 : 4);
    }
  const comm::Stats got = c.stats();
  for (DType t : {DType::kF32, DType::kBF16, DType::kI32}) {
    const comm::Counters& g = got[Op::kAllToAll][t];
    const int ti = static_cast<int>(t);
    check(g.calls == calls[ti] && g.bytes_sent == bytes[ti] && g.bytes_received == bytes[ti],
          cat("stats of ", dtype_name(t), " all_to_all on ", c.name(), " (", c.backend(), "): ", g.calls,
              " calls, ", g.bytes_sent, "/", g.bytes_received, " bytes; expected ", calls[ti], ", ",
              bytes[ti], "/", bytes[ti]));
  }
  check_all_to_all_refused(c, mem);
}

// An all-to-all on `b` chained after a reduce-scatter on `a` (the same ranks):
// `before` converts the reduce-scatter's fp32 output to the bf16 the all-to-all
// sends, `then` adds what it received into an fp32 buffer. Only the last op is
// waited for. Integer data: the fp32 sums are exact whatever MPI's order.
void check_chained_all_to_all(comm::Communicator& a, comm::Communicator& b, Memory& mem, int64_t count,
                              uint64_t seed) {
  const int n = a.size(), me = a.rank();
  const int64_t rows = count * n;  // what the reduce-scatter hands each rank
  const auto x_of = [&](int r, int64_t k) {
    return static_cast<float>(static_cast<int64_t>(splitmix(seed + r * 1000003ull + k) % 2001) - 1000);
  };
  const auto to_bytes = [](const auto& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    return std::vector<uint8_t>(p, p + v.size() * sizeof v[0]);
  };
  std::vector<float> x(static_cast<size_t>(rows * n)), acc0(static_cast<size_t>(rows));
  for (int64_t k = 0; k < rows * n; ++k) x[k] = x_of(me, k);
  for (int64_t k = 0; k < rows; ++k) acc0[k] = static_cast<float>(k % 5);
  auto xs = mem.make(to_bytes(x));
  auto d = mem.make(to_bytes(std::vector<float>(static_cast<size_t>(rows), -7.0f)));
  auto s = mem.make(std::vector<uint8_t>(static_cast<size_t>(rows * 2), 0xff));
  auto rv = mem.make(std::vector<uint8_t>(static_cast<size_t>(rows * 2), 0xff));
  auto acc = mem.make(to_bytes(acc0));

  comm::OpArgs o;
  o.op = Op::kAllToAll;
  o.send = s.get();
  o.recv = rv.get();
  o.count = count;
  o.dtype = DType::kBF16;
  o.after = a.reduce_scatter(xs.get(), rows, d.get());
  o.before = {comm::Local::kCopy, d.get(), DType::kF32, s.get(), DType::kBF16, rows, 1, {}};
  o.then = {comm::Local::kAdd, rv.get(), DType::kBF16, acc.get(), DType::kF32, rows, 1, {}};
  b.submit(o).wait();

  // Rank r's reduce-scatter output, element k, as bf16: what it sends.
  const auto sent = [&](int r, int64_t k) {
    float sum = 0;
    for (int q = 0; q < n; ++q) sum += x_of(q, r * rows + k);
    return bf16_nearest(sum);
  };
  std::vector<uint16_t> want_rv;
  std::vector<float> want_acc;
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < count; ++i) {
      want_rv.push_back(sent(r, me * count + i));
      want_acc.push_back(acc0[want_acc.size()] + bf16_value(want_rv.back()));
    }
  check(mem.read(rv.get(), rows * 2) == to_bytes(want_rv) && mem.read(acc.get(), rows * 4) == to_bytes(want_acc),
        cat("bf16 all_to_all on ", b.name(), " (", b.backend(), ", ", n, " ranks) chained after a reduce_scatter on ",
            a.name(), ", with before and then steps, count ", count));
}

// --wire DIR: every op of every dtype on a group of its own, then this rank's
// accounting as JSON: {group: {"size": n, op: {dtype: [calls, sent, received]}}}.
void write_wire_stats(const std::string& dir) {
  std::string json = "{";
  bool first = true;
  for (DType t : {DType::kF32, DType::kBF16, DType::kI32}) {
    for (Op op : comm::kAllOps) {
      const bool reduces = op == Op::kReduceScatter || op == Op::kAllReduce;
      if (t == DType::kI32 && reduces) continue;
      const std::string name = cat("wire.", dtype_name(t), ".", comm::op_name(op));
      auto c = comm::make_mpi_communicator(comm::dup_group(MPI_COMM_WORLD, name));
      const int n = c->size();
      for (int64_t k : {0, 1, 7, 1001, 4099}) {
        std::vector<uint32_t> a(static_cast<size_t>(k * n) + 1, 0), b(static_cast<size_t>(k * n) + 1, 0);
        switch (op) {
          case Op::kAllGather: c->all_gather(a.data(), k, b.data(), t); break;
          case Op::kReduceScatter: c->reduce_scatter(a.data(), k, b.data(), t); break;
          case Op::kAllReduce: c->all_reduce(a.data(), k, t); break;
          case Op::kBroadcast: c->broadcast(a.data(), k, static_cast<int>(k % n), t); break;
          case Op::kAllToAll: c->all_to_all(a.data(), k, b.data(), t); break;
        }
        c->synchronize();
      }
      const comm::Counters s = c->stats()[op][t];
      json += cat(first ? "" : ",", "\n \"", name, "\": {\"size\": ", n, ", \"", comm::op_name(op),
                  "\": {\"", dtype_name(t), "\": [", s.calls, ", ", s.bytes_sent, ", ",
                  s.bytes_received, "]}}");
      first = false;
    }
  }
  json += "\n}\n";
  std::ofstream(cat(dir, "/amsp-rank-", g_rank, ".json")) << json;
}

}  // namespace

int main(int argc, char** argv) {
  comm::MpiSession session(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  if (argc == 3 && std::string(argv[1]) == "--wire") {
    write_wire_stats(argv[2]);
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 0) std::printf("wrote %s/amsp-rank-*.json\n", argv[2]);
    return 0;
  }
  if (g_rank == 0)
    std::printf("comm collectives test: %d ranks, progress %s\n", g_world,
                comm::progress_name(session.progress()));
  {
    auto world = comm::make_mpi_communicator(comm::dup_group(MPI_COMM_WORLD, "world"));
    uint64_t seed = 1;
    for (int64_t count : {0, 1, 7, 1000, 4099, 100003}) check_ops(*world, count, seed += 10);
    for (int64_t real : {1, 5, 1001, 65537}) check_padding(*world, real, seed += 10);
    check_issue_order(*world);
    check_accounting(*world);

    // bf16 and int32 on the world, on pairs of ranks ({0,1}, {2,3}; with 3 ranks
    // {0,1} and {2}) and on single ranks.
    for (int64_t count : {0, 1, 7, 1001, 4099, 100003}) check_ops_bf16(*world, count, seed += 10);
    for (int64_t real : {1, 5, 1001, 65537}) check_padding_bf16(*world, real, seed += 10);
    {
      const int first = g_rank - g_rank % 2;
      std::vector<int> pair{first};
      if (first + 1 < g_world) pair.push_back(first + 1);
      auto two = comm::make_mpi_communicator(comm::make_group(MPI_COMM_WORLD, pair, "pair"));
      auto one = comm::make_mpi_communicator(comm::make_group(MPI_COMM_WORLD, {g_rank}, "self"));
      for (comm::Communicator* c : {two.get(), one.get()}) {
        for (int64_t count : {0, 1, 7, 1001}) check_ops_bf16(*c, count, seed += 10);
        check_padding_bf16(*c, 1001, seed += 10);
        check_int32(*c, 33);
      }
      check_accounting_by_dtype(*world);
    }
    check_int32(*world, 0);
    check_int32(*world, 1001);

    // all-to-all on the world, a pair and a single rank, then chained after a
    // reduce-scatter on another communicator of the world.
    {
      const int first = g_rank - g_rank % 2;
      std::vector<int> pair{first};
      if (first + 1 < g_world) pair.push_back(first + 1);
      auto two = comm::make_mpi_communicator(comm::make_group(MPI_COMM_WORLD, pair, "pair"));
      auto one = comm::make_mpi_communicator(comm::make_group(MPI_COMM_WORLD, {g_rank}, "self"));
      auto chain = comm::make_mpi_communicator(comm::dup_group(MPI_COMM_WORLD, "chain"));
      Memory host(false);
      check_all_to_all_cases(*world, host, {0, 1, 7, 1001, 100003}, seed += 1000);
      for (comm::Communicator* c : {two.get(), one.get()})
        check_all_to_all_cases(*c, host, {0, 1, 7, 1001}, seed += 1000);
      check_chained_all_to_all(*world, *chain, host, 4099, seed += 10);
      check_chained_all_to_all(*world, *chain, host, 0, seed += 10);
    }

    // The five groups of a plan on a fake mesh (2 ranks per node when the world
    // is even), as the engine will build them.
    const plan::MeshShape shape = g_world % 2 == 0 ? plan::MeshShape{2, g_world / 2}
                                                   : plan::MeshShape{g_world, 1};
    const std::string plan_text = g_world % 2 == 0 ? cat("p=2x1,g=2x1,os=2x", g_world / 2)
                                                   : cat("p=1,g=1,os=", g_world, "x1");
    const plan::Mesh mesh(plan::parse_shard_plan(plan_text, shape), shape);
    std::vector<int> order(static_cast<size_t>(g_world));
    for (int i = 0; i < g_world; ++i) order[i] = i;
    std::vector<std::unique_ptr<comm::Communicator>> groups;
    for (plan::GroupKind kind : plan::kAllGroups) {
      groups.push_back(comm::make_mpi_communicator(
          comm::make_group(MPI_COMM_WORLD, [&] {
            std::vector<int> m;
            for (int64_t p : mesh.group_members(kind, g_rank)) m.push_back(static_cast<int>(p));
            return m;
          }(), plan::group_name(kind))));
      auto& c = *groups.back();
      check(c.size() == mesh.group_size(kind) && c.rank() == mesh.index_in_group(kind, g_rank),
            cat("group ", c.name(), " of plan ", plan_text, ": size and index"));
      check_ops(c, 4099, seed += 10);
      check_padding(c, 1001, seed += 10);
    }
    // make_plan_group builds the same groups.
    for (plan::GroupKind kind : plan::kAllGroups) {
      auto c = comm::make_mpi_communicator(engine::make_plan_group(MPI_COMM_WORLD, mesh, kind, order));
      check(c->size() == mesh.group_size(kind) && c->rank() == mesh.index_in_group(kind, g_rank),
            cat("make_plan_group ", c->name()));
    }

    // Two groups at once, ops interleaved: each group keeps its own order and
    // neither blocks the other.
    {
      auto& a = *groups[0];  // P
      auto& b = *groups[2];  // OS
      const int64_t count = 50000;
      std::vector<float> x(count, 1.0f), y(count, 2.0f);
      std::vector<comm::Handle> hs;
      for (int k = 0; k < 4; ++k) {
        hs.push_back(a.all_reduce(x.data(), count));
        hs.push_back(b.all_reduce(y.data(), count));
      }
      for (auto& h : hs) h.wait();
      const double wx = std::pow(a.size(), 4), wy = 2 * std::pow(b.size(), 4);
      check(std::fabs(x[count - 1] - wx) < 1e-3 * wx && std::fabs(y[0] - wy) < 1e-3 * wy,
            "interleaved ops on two groups");
    }
    groups.clear();
  }
  // The NCCL backend over the emulated NCCL, on device buffers: the same
  // all-to-all checks (once: the MPI backend's progress mode does not matter).
  if (session.progress() == comm::Progress::kThread) {
    cudaStream_t compute = nullptr;
    cudaStreamCreate(&compute);
    const int first = g_rank - g_rank % 2;
    std::vector<int> pair{first};
    if (first + 1 < g_world) pair.push_back(first + 1);
    {
      comm::NcclCommunicator world(comm::dup_group(MPI_COMM_WORLD, "nccl.world"), compute);
      comm::NcclCommunicator chain(comm::dup_group(MPI_COMM_WORLD, "nccl.chain"), compute);
      comm::NcclCommunicator two(comm::make_group(MPI_COMM_WORLD, pair, "nccl.pair"), compute);
      comm::NcclCommunicator one(comm::make_group(MPI_COMM_WORLD, {g_rank}, "nccl.self"), compute);
      Memory device(true);
      uint64_t seed = 7000;
      for (comm::Communicator* c : std::initializer_list<comm::Communicator*>{&world, &two, &one})
        check_all_to_all_cases(*c, device, {0, 1, 7, 1001}, seed += 1000);
      check_chained_all_to_all(world, chain, device, 1001, seed += 10);
    }
    cudaStreamDestroy(compute);
  }
  return g_checks.finish();
}
