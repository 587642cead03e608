// Names a rank that is persistently slower than the others, while the job runs.
//
// Wall time cannot tell: the gradient collectives make every rank wait for the
// slowest, so every rank's step takes as long. What differs is the time a rank
// is busy: on a device its step less the time it waited in collectives (the
// communicators' exposed time), on the CPU the CPU time of its computing
// threads (Run::busy_seconds says why). Every `every` steps the ranks exchange their mean busy time
// per step over the window (one all-reduce of a number per rank), and every
// rank reaches the same verdict from the same numbers: a rank whose busy time
// is more than `threshold` above the median, and the slowest, for `windows`
// windows in a row is a straggler. Rank 0 prints one line when it becomes one
// and one when it recovers (doc/cluster.md, "When a job is slow").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace amsp::engine {

struct StragglerOptions {
  int64_t every = 50;       // steps per window; 0: off
  double threshold = 0.10;  // fraction above the median busy time
  int64_t windows = 3;      // consecutive windows before a rank is named
};

// One window's comparison, the same on every rank.
struct BusySpread {
  std::vector<double> busy_ms;  // per world rank: mean busy milliseconds per step
  double median_ms = 0;
  int slowest = 0;              // the rank with the largest busy time
  double excess = 0;            // slowest's busy time / median - 1
  int straggler = -1;           // the rank named as persistently slow, -1: none
};

// The verdict on a window from its per-rank busy times and what the windows
// before said (`run`: consecutive windows over the threshold so far, for
// `candidate`). Pure, for the unit tests.
BusySpread judge_window(std::vector<double> busy_ms, const StragglerOptions& o, int* candidate, int64_t* run);

class StragglerWatch {
 public:
  StragglerWatch(const StragglerOptions& o, int rank, int world, double comm_timeout_s);
  // This rank's busy seconds in `step`. Collective over MPI_COMM_WORLD at the
  // end of every window; returns the window's spread then.
  std::optional<BusySpread> add(int64_t step, double busy_s);

 private:
  StragglerOptions o_;
  int rank_, world_;
  double timeout_s_;
  double sum_s_ = 0;
  int64_t steps_ = 0;
  int candidate_ = -1;
  int64_t run_ = 0;
  int named_ = -1;  // the rank reported as a straggler now, -1: none
};

}  // namespace amsp::engine
