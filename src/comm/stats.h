// What each group's collectives cost, per operation: calls, bytes (as defined
// by traffic_bytes in comm/traffic.h, so a plan's traffic can be predicted
// exactly), time in flight and exposed time.
//
//   in flight  from the call that issued the op to the moment the backend saw
//              it complete (with progress=none, that moment is inside the
//              caller's test or wait, since nothing else drives MPI)
//   exposed    time callers spent blocked in Handle::wait / synchronize: the
//              part of the communication that compute did not hide
#pragma once

#include <mpi.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/traffic.h"

namespace amsp::comm {

struct OpStats {
  int64_t calls = 0;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  double in_flight_s = 0;
  double exposed_s = 0;
};

struct Stats {
  std::string group;  // the group's name, e.g. "P" or "node"
  std::array<OpStats, kNumOps> ops{};

  OpStats& operator[](Op op) { return ops[static_cast<int>(op)]; }
  const OpStats& operator[](Op op) const { return ops[static_cast<int>(op)]; }
  OpStats total() const;
};

// Over the ranks of comm (collective): counts and bytes summed, times the max
// over ranks (the slowest rank is what a synchronous step waits for).
Stats reduce_stats(const Stats& local, MPI_Comm comm);

// A fixed-width table, one row per (group, op) that was called:
//   group  op  calls  sent  received  in-flight(ms)  exposed(ms)  exposed%
std::string format_stats(const std::vector<Stats>& stats);

}  // namespace amsp::comm
