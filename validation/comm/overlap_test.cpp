// Does a collective progress while the caller computes? Issues a large
// reduce-scatter over the whole job, computes for a fixed time, then waits, and
// compares the time the caller was blocked in wait (exposed) with the op's
// time in flight. Used by CTest (--check) and for the measurements in
// doc/communication.md (AMSP_COMM_PROGRESS=thread|mpi-async|none).
//
//   overlap_test [--compute sleep|busy] [--mib N] [--reps N] [--check MAX_RATIO]
//
// "sleep" computes nothing for a fixed time (the CPU is free, as when a GPU
// computes); "busy" does a fixed amount of arithmetic, calibrated to take that
// time with no collective in flight, as a CPU trainer does; communication that
// steals CPU from it shows as a longer step.

#include <mpi.h>

#include <algorithm>
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

}  // namespace

int main(int argc, char** argv) {
  std::string kind = "busy";
  int64_t mib = 32;
  int reps = 3;
  double check = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--compute")) kind = argv[i + 1];
    else if (!std::strcmp(argv[i], "--mib")) mib = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--check")) check = std::atof(argv[i + 1]);
  }
  comm::MpiSession session(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  int failed = 0;
  {
    auto c = comm::make_mpi_communicator(comm::dup_group(MPI_COMM_WORLD, "world"));
    const int64_t count = mib * (1 << 20) / 4 / world;  // per rank
    std::vector<float> send(static_cast<size_t>(count * world), 1.0f), recv(count);

    // The op alone (after a warm-up).
    c->reduce_scatter(send.data(), count, recv.data()).wait();
    std::vector<double> alone;
    for (int r = 0; r < reps; ++r) {
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
      if (kind == "sleep") std::this_thread::sleep_for(std::chrono::duration<double>(d));
      else work(blocks);
      t_compute = max_over_ranks(comm::now_seconds() - t0);
    }

    // The op while computing for d.
    c->reset_stats();
    double total = 0;
    for (int r = 0; r < reps; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = comm::now_seconds();
      comm::Handle h = c->reduce_scatter(send.data(), count, recv.data());
      if (kind == "sleep") std::this_thread::sleep_for(std::chrono::duration<double>(d));
      else work(blocks);
      h.wait();
      total += comm::now_seconds() - t0;
    }
    const comm::Stats s = comm::reduce_stats(c->stats(), MPI_COMM_WORLD);
    const comm::OpStats& o = s[comm::Op::kReduceScatter];
    const double in_flight = o.in_flight_s / reps, exposed = o.exposed_s / reps;
    total = max_over_ranks(total) / reps;
    const double ratio = exposed / std::max(in_flight, 1e-9);
    if (rank == 0) {
      std::printf(
          "progress=%-9s ranks=%d compute=%-5s reduce_scatter %lld MiB: alone %.1f ms, "
          "compute %.1f ms, in flight %.1f ms, exposed %.1f ms (%.0f%% of in flight), "
          "step %.1f ms (compute alone %.1f ms, + op alone = %.1f ms); compute rate %.0f blocks/ms\n",
          comm::progress_name(session.progress()), world, kind.c_str(),
          static_cast<long long>(mib), t_alone * 1e3, d * 1e3, in_flight * 1e3, exposed * 1e3,
          100 * ratio, total * 1e3, t_compute * 1e3, (t_compute + t_alone) * 1e3,
          kind == "sleep" ? 0.0 : static_cast<double>(blocks) / (t_compute * 1e3));
      if (check >= 0) {
        // Both: the caller-driven modes only notice completion inside wait,
        // which stretches their time in flight; the op alone is the yardstick
        // that does not depend on who observes completion.
        failed = exposed > check * in_flight || exposed > check * t_alone;
        std::printf("%d passed, %d failed (exposed must be <= %.2f x in flight and x op alone)\n",
                    1 - failed, failed, check);
      }
    }
    MPI_Bcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD);
  }
  return failed;
}
