// MPI system test of the communication layer (run under mpiexec -n 3 and -n 4):
// every collective against a straightforward reference on random data, sizes
// that do not split evenly (padding) and zero-length ones, issue-order
// completion, groups built from a shard plan's mesh, concurrent groups, and
// the accounting against traffic_bytes. Prints "N passed, M failed".

#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/group.h"
#include "comm/traffic.h"
#include "core/error.h"
#include "engine/plan_groups.h"
#include "plan/mesh.h"
#include "plan/shard_plan.h"

using namespace amsp;
using comm::Op;

namespace {

int g_rank = 0, g_world = 1;
int g_passed = 0, g_failed = 0;

// A check passes only if it passes on every rank.
void check(bool ok, const std::string& what) {
  int all = ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (all) {
    ++g_passed;
  } else {
    ++g_failed;
    if (!ok) std::fprintf(stderr, "FAIL (rank %d): %s\n", g_rank, what.c_str());
  }
}

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
// all-gather and reduce-scatter move (n-1) blocks of the per-rank count, an
// all-reduce 2(n-1) blocks of ceil(count/n), a broadcast's root sends the
// buffer once and every other rank receives it; 4-byte floats.
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
    c.synchronize();
    gather += (n - 1) * k * 4;
    allreduce += 2 * (n - 1) * ((k + n - 1) / n) * 4;
    bcast += n > 1 ? k * 4 : 0;
  }
  // {sent, received} per op on this rank; a group of one moves nothing.
  const int64_t want[4][2] = {{gather, gather},
                              {gather, gather},
                              {allreduce, allreduce},
                              {me == root ? bcast : 0, me == root ? 0 : bcast}};
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

}  // namespace

int main(int argc, char** argv) {
  comm::MpiSession session(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
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
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_rank == 0) std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed ? 1 : 0;
}
