#include "engine/run_info.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace amsp::engine {
namespace {

// Spins the calling thread for `seconds` of its own CPU time.
void spin_cpu(double seconds) {
  const double until = caller_cpu_seconds() + seconds;
  while (caller_cpu_seconds() < until) {
  }
}

// A thread outside the OpenMP team (the communication thread, the checkpoint
// writer) may burn CPU while the ranks' busy time is measured: it must not count.
TEST(ComputeCpu, LeavesOutThreadsThatDoNotCompute) {
  std::atomic<bool> started{false};
  const double before = compute_cpu_seconds();
  std::thread poller([&] {
    started = true;
    spin_cpu(0.3);
  });
  while (!started) std::this_thread::yield();
  poller.join();
  EXPECT_LT(compute_cpu_seconds() - before, 0.1) << "another thread's 0.3 s of CPU time was counted";
}

// The kernels' OpenMP team computes for the rank: every member's time counts.
TEST(ComputeCpu, CountsEveryThreadOfTheTeam) {
  omp_set_num_threads(2);
  const double before = compute_cpu_seconds();
#pragma omp parallel num_threads(2)
  spin_cpu(0.1);
  EXPECT_GT(compute_cpu_seconds() - before, 0.18) << "2 threads spun 0.1 s each";
}

}  // namespace
}  // namespace amsp::engine
