// Does a collective progress while the caller computes, without the caller's
// help? Two uses:
//
//   overlap_test --expect progress|no-progress [--mib N] [--budget BLOCKS] [--watchdog S]
//   overlap_test --measure [--compute sleep|busy] [--mib N] [--reps N]
//
// --expect (CTest, one test per progress mode) judges by counting, not by the
// clock. Rank 0 issues a reduce-scatter and only then lets the other ranks
// issue theirs (a token passed 0 -> 1 -> ... -> n-1), so the op cannot
// complete before rank 0's issue has returned. Rank 0 then computes blocks of
// arithmetic that never call MPI or the communicator, and after each block
// counts how many bytes of its result hold their final value (every rank's
// contribution is positive, so no partial sum equals the total); it stops when
// all have arrived, or at --budget blocks. In thread mode it also computes on
// until the communicator has recorded the op complete (its trace callback),
// which must happen on another thread. Then it waits and checks every element.
//   progress     all result bytes arrived within the budget (and, in thread
//                mode, the completion was recorded off the caller's thread):
//                what thread and mpi-async must show. A communication thread
//                that is off fails it at the budget; one that runs the op
//                inside issue() never lets the other ranks issue, and the
//                watchdog ends the test naming that.
//   no-progress  no result byte arrived and no completion was recorded before
//                the wait: what none shows, since MPICH moves a collective only
//                inside the caller's MPI calls.
// The load on the machine changes how long this takes, not the verdict: the
// budget is counted in blocks, which a loaded core computes slower too, and is
// hundreds of times what the op needs (doc/communication.md, "Tests").
//
// --measure takes the figures of doc/communication.md: the op alone, then the
// op issued before a compute of about 3x its time and waited for after, and
// the time the caller was blocked in wait (exposed). "sleep" computes nothing
// for a fixed time (the CPU is free, as when a GPU computes); "busy" does a
// fixed amount of arithmetic, calibrated to take that time with no collective
// in flight, as a CPU trainer does; communication that steals CPU from it
// shows as a longer step. No verdict: these are wall times.

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/group.h"

using namespace amsp;

namespace {

double g_sink = 0;

// Arithmetic that cannot be optimised away, in blocks of 10^4 steps.
void work(int64_t blocks) {
  double x = 1.0;
  for (int64_t b = 0; b < blocks; ++b)
    for (int i = 0; i < 10000; ++i) x = x * 1.0000001 + 1e-9;
  g_sink += x;
}

// How many blocks of work take `seconds` here (median of three timings).
int64_t calibrate(double seconds) {
  const int64_t probe = 2000;
  std::vector<double> t;
  for (int i = 0; i < 3; ++i) {
    const double t0 = comm::now_seconds();
    work(probe);
    t.push_back(comm::now_seconds() - t0);
  }
  std::sort(t.begin(), t.end());
  return std::max<int64_t>(1, static_cast<int64_t>(probe * seconds / t[1]));
}

double max_over_ranks(double v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return v;
}

struct Options {
  std::string expect;  // "progress", "no-progress", or empty with --measure
  bool measure = false;
  std::string compute = "busy";
  int64_t mib = 32;
  int reps = 3;
  int64_t budget = 1000000;  // blocks (about 30 s of one idle core here)
  unsigned watchdog_s = 240;
};

// A test whose op never completes would otherwise hang until CTest kills it,
// saying nothing. The limit (--watchdog seconds, default 240, below CTest's
// 300) only turns a hang into a message; no verdict depends on it.
int g_rank = -1;  // the watchdog's message comes from rank 0 only

void on_watchdog(int) {
  if (g_rank != 0) std::_Exit(1);
  static const char msg[] =
      "overlap_test: no verdict before the watchdog: the reduce-scatter never completed "
      "(did issue() block until the op was done, so that the other ranks never issued?)\n"
      "0 passed, 1 failed\n";
  (void)!::write(2, msg, sizeof msg - 1);
  std::_Exit(1);
}

// The elements [*next, n) of `recv` not yet seen holding `total`, scanned in
// order: *next advances past every element that holds it. MPI may still be
// writing the buffer, hence the atomic loads; an element once final stays so.
void advance(float* recv, int64_t n, float total, int64_t* next) {
  while (*next < n && std::atomic_ref<float>(recv[*next]).load(std::memory_order_relaxed) == total)
    ++*next;
}

int check(const Options& o, comm::Progress progress, int rank, int world) {
  const int64_t count = o.mib * (1 << 20) / 4 / world;  // per rank
  const float total = static_cast<float>(world * (world + 1) / 2);  // exact in fp32
  std::vector<float> send(static_cast<size_t>(count * world), static_cast<float>(rank + 1));
  std::vector<float> recv(static_cast<size_t>(count), -1.0f);

  // Who recorded the op complete, and when in rank 0's compute (declared
  // before the communicator, whose trace callback uses them, so they outlive it).
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int64_t> blocks{0};
  std::atomic<bool> recorded{false}, recorded_by_caller{false};
  std::atomic<int64_t> recorded_at{-1};
  auto c = comm::make_mpi_communicator(comm::dup_group(MPI_COMM_WORLD, "world"));
  // The other ranks wait while rank 0 spends its budget: only the watchdog
  // limits them. Rank 0's own wait comes after its verdict and may end sooner.
  c->set_timeout(0);
  c->set_trace([&](comm::Op, uint64_t, double, double, bool waited) {
    if (waited) return;
    recorded_by_caller = std::this_thread::get_id() == caller;
    recorded_at = blocks.load();
    recorded = true;
  });

  g_rank = rank;
  std::signal(SIGALRM, on_watchdog);
  ::alarm(o.watchdog_s);
  MPI_Barrier(MPI_COMM_WORLD);
  const int token_tag = 7;
  int token = 0;
  if (rank > 0) MPI_Recv(&token, 1, MPI_INT, rank - 1, token_tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  comm::Handle h = c->reduce_scatter(send.data(), count, recv.data());
  if (rank + 1 < world) MPI_Send(&token, 1, MPI_INT, rank + 1, token_tag, MPI_COMM_WORLD);
  int failed = 0;
  if (rank > 0) {
    h.wait();
  } else {
    // From here to the wait: no call into MPI or the communicator.
    int64_t arrived = 0, arrived_at = -1;
    advance(recv.data(), count, total, &arrived);
    if (arrived == count) arrived_at = 0;
    while (blocks.load(std::memory_order_relaxed) < o.budget) {
      if (arrived == count && (progress != comm::Progress::kThread || recorded)) break;
      work(1);
      blocks.fetch_add(1, std::memory_order_relaxed);
      if (arrived < count) {
        advance(recv.data(), count, total, &arrived);
        if (arrived == count) arrived_at = blocks.load();
      }
    }
    const int64_t computed = blocks.load();
    const bool seen = recorded, seen_by_caller = recorded_by_caller;
    const int64_t seen_at = recorded_at;

    // The verdict on progress, printed before the wait: with a stopped
    // progress thread the wait ends the job by timeout.
    std::printf("progress=%s ranks=%d reduce_scatter %lld MiB: %lld of %lld result bytes on rank 0 "
                "arrived while it computed (%lld blocks, budget %lld)",
                comm::progress_name(progress), world, static_cast<long long>(o.mib),
                static_cast<long long>(arrived * 4), static_cast<long long>(count * 4),
                static_cast<long long>(computed), static_cast<long long>(o.budget));
    if (arrived_at >= 0) std::printf(", all of them by block %lld", static_cast<long long>(arrived_at));
    if (seen)
      std::printf("; recorded complete by %s at block %lld\n",
                  seen_by_caller ? "the caller" : "another thread", static_cast<long long>(seen_at));
    else
      std::printf("; not recorded complete before the wait\n");
    std::string why;
    if (o.expect == "progress" && arrived < count)
      why = "the result had not arrived when the budget of compute was spent: nothing progressed "
            "the op while the caller computed";
    else if (o.expect == "progress" && progress == comm::Progress::kThread && (!seen || seen_by_caller))
      why = "the data arrived, but the communicator did not record the op complete on its own thread "
            "while the caller computed";
    else if (o.expect == "no-progress" && (arrived > 0 || seen))
      why = "the op progressed while the caller computed, which this mode cannot do";
    if (!why.empty()) std::printf("FAIL: %s\n", why.c_str());
    std::fflush(stdout);

    c->set_timeout(30);  // a stopped progress thread: end, naming the op
    const double t0 = comm::now_seconds();
    h.wait();
    const double waited = comm::now_seconds() - t0;
    int64_t wrong = 0;
    for (float v : recv) wrong += v != total;
    std::printf("the wait took %.1f ms; %lld of %lld elements wrong after it\n", waited * 1e3,
                static_cast<long long>(wrong), static_cast<long long>(count));
    failed = !why.empty() || wrong;
    std::printf("%d passed, %d failed (expected: %s)\n", 1 - failed, failed, o.expect.c_str());
    std::fflush(stdout);
  }
  MPI_Bcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD);
  ::alarm(0);
  return failed;
}

void measure(const Options& o, comm::Progress progress, int rank, int world) {
  auto c = comm::make_mpi_communicator(comm::dup_group(MPI_COMM_WORLD, "world"));
  const int64_t count = o.mib * (1 << 20) / 4 / world;  // per rank
  std::vector<float> send(static_cast<size_t>(count * world), 1.0f), recv(count);
  const bool sleep = o.compute == "sleep";

  // The op alone (after a warm-up).
  c->reduce_scatter(send.data(), count, recv.data()).wait();
  std::vector<double> alone;
  for (int r = 0; r < o.reps; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = comm::now_seconds();
    c->reduce_scatter(send.data(), count, recv.data()).wait();
    alone.push_back(max_over_ranks(comm::now_seconds() - t0));
  }
  std::sort(alone.begin(), alone.end());
  const double t_alone = alone[alone.size() / 2];
  const double d = std::clamp(3 * t_alone, 0.05, 3.0);
  int64_t blocks = calibrate(d);
  MPI_Allreduce(MPI_IN_PLACE, &blocks, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
  double t_compute = 0;  // the compute alone, as it runs here
  {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = comm::now_seconds();
    if (sleep) std::this_thread::sleep_for(std::chrono::duration<double>(d));
    else work(blocks);
    t_compute = max_over_ranks(comm::now_seconds() - t0);
  }

  // The op while computing for d.
  c->reset_stats();
  double total = 0;
  for (int r = 0; r < o.reps; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = comm::now_seconds();
    comm::Handle h = c->reduce_scatter(send.data(), count, recv.data());
    if (sleep) std::this_thread::sleep_for(std::chrono::duration<double>(d));
    else work(blocks);
    h.wait();
    total += comm::now_seconds() - t0;
  }
  const comm::Stats s = comm::reduce_stats(c->stats(), MPI_COMM_WORLD);
  const comm::OpStats& op = s[comm::Op::kReduceScatter];
  const double in_flight = op.in_flight_s / o.reps, exposed = op.exposed_s / o.reps;
  total = max_over_ranks(total) / o.reps;
  if (rank == 0)
    std::printf(
        "progress=%-9s ranks=%d compute=%-5s reduce_scatter %lld MiB: alone %.1f ms, "
        "compute %.1f ms, in flight %.1f ms, exposed %.1f ms (%.0f%% of in flight), "
        "step %.1f ms (compute alone %.1f ms, + op alone = %.1f ms); compute rate %.0f blocks/ms\n",
        comm::progress_name(progress), world, o.compute.c_str(), static_cast<long long>(o.mib),
        t_alone * 1e3, d * 1e3, in_flight * 1e3, exposed * 1e3,
        100 * exposed / std::max(in_flight, 1e-9), total * 1e3, t_compute * 1e3,
        (t_compute + t_alone) * 1e3, sleep ? 0.0 : static_cast<double>(blocks) / (t_compute * 1e3));
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (!std::strcmp(argv[i], "--measure")) o.measure = true;
    else if (!std::strcmp(argv[i], "--expect") && has_value) o.expect = argv[++i];
    else if (!std::strcmp(argv[i], "--compute") && has_value) o.compute = argv[++i];
    else if (!std::strcmp(argv[i], "--mib") && has_value) o.mib = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && has_value) o.reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--budget") && has_value) o.budget = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--watchdog") && has_value) o.watchdog_s = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "overlap_test: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (o.measure == !o.expect.empty() || (!o.measure && o.expect != "progress" && o.expect != "no-progress") ||
      (o.compute != "busy" && o.compute != "sleep") || o.mib <= 0 || o.reps <= 0 || o.budget <= 0 ||
      o.watchdog_s == 0) {
    std::fprintf(stderr,
                 "usage: overlap_test --expect progress|no-progress [--mib N] [--budget BLOCKS] [--watchdog S]\n"
                 "       overlap_test --measure [--compute sleep|busy] [--mib N] [--reps N]\n");
    return 2;
  }
  comm::MpiSession session(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (o.measure) {
    measure(o, session.progress(), rank, world);
    return 0;
  }
  return check(o, session.progress(), rank, world);
}
