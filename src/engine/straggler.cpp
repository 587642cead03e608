#include "engine/straggler.h"

#include <mpi.h>

#include <algorithm>
#include <cstdio>

#include "comm/timed.h"
#include "comm/watchdog.h"

namespace amsp::engine {

BusySpread judge_window(std::vector<double> busy_ms, const StragglerOptions& o, int* candidate, int64_t* run) {
  BusySpread s;
  s.busy_ms = std::move(busy_ms);
  std::vector<double> sorted = s.busy_ms;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  if (n == 0) return s;
  s.median_ms = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  s.slowest = static_cast<int>(std::max_element(s.busy_ms.begin(), s.busy_ms.end()) - s.busy_ms.begin());
  s.excess = s.median_ms > 0 ? s.busy_ms[s.slowest] / s.median_ms - 1 : 0;
  if (n > 1 && s.excess > o.threshold) {
    *run = s.slowest == *candidate ? *run + 1 : 1;
    *candidate = s.slowest;
  } else {
    *run = 0;
    *candidate = -1;
  }
  s.straggler = *run >= o.windows ? *candidate : -1;
  return s;
}

StragglerWatch::StragglerWatch(const StragglerOptions& o, int rank, int world, double comm_timeout_s)
    : o_(o), rank_(rank), world_(world), timeout_s_(comm_timeout_s) {}

std::optional<BusySpread> StragglerWatch::add(int64_t step, double busy_s) {
  sum_s_ += busy_s;
  ++steps_;
  if (o_.every <= 0 || step % o_.every != 0) return std::nullopt;
  // A sum in which every other rank adds 0: a gather, on the world's timed all-reduce.
  std::vector<double> busy(static_cast<size_t>(world_), 0.0);
  busy[rank_] = sum_s_ / static_cast<double>(steps_) * 1e3;
  comm::allreduce_sum(busy.data(), world_, MPI_COMM_WORLD, "busy times", timeout_s_);
  sum_s_ = 0;
  steps_ = 0;
  BusySpread s = judge_window(std::move(busy), o_, &candidate_, &run_);
  if (rank_ == 0 && s.straggler >= 0 && s.straggler != named_) {
    std::printf("straggler: %s is %.0f%% busier than the median rank (%.2f against %.2f ms per step) "
                "in %lld windows of %lld steps up to step %lld\n",
                comm::watchdog::rank_name(s.straggler).c_str(), 100 * s.excess, s.busy_ms[s.straggler],
                s.median_ms, static_cast<long long>(run_), static_cast<long long>(o_.every),
                static_cast<long long>(step));
    std::fflush(stdout);
  } else if (rank_ == 0 && s.straggler < 0 && named_ >= 0) {
    std::printf("straggler: %s is back within %.0f%% of the median rank at step %lld\n",
                comm::watchdog::rank_name(named_).c_str(), 100 * o_.threshold, static_cast<long long>(step));
    std::fflush(stdout);
  }
  named_ = s.straggler;
  return s;
}

}  // namespace amsp::engine
