// What each group's collectives cost, per operation and, within it, per
// element type: calls, bytes (as defined by traffic_bytes in comm/traffic.h
// with the element's size, so a plan's traffic can be predicted exactly), time
// in flight and exposed time.
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
#include "core/dtype.h"

namespace amsp::comm {

// What some calls cost.
struct Counters {
  int64_t calls = 0;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  double in_flight_s = 0;
  double exposed_s = 0;

  void add(const Counters& o) {
    calls += o.calls;
    bytes_sent += o.bytes_sent;
    bytes_received += o.bytes_received;
    in_flight_s += o.in_flight_s;
    exposed_s += o.exposed_s;
  }
};

// One op: the totals (the fields of Counters) and the same split by element
// type. The communicators add every call to both, so by_dtype sums to the
// totals; a caller that adds to the totals by hand (a blocking all-reduce of a
// double outside the communicators) leaves the difference unattributed, and
// format_stats shows it as dtype "-".
struct OpStats : Counters {
  std::array<Counters, kNumDTypes> by_dtype{};

  Counters& operator[](DType t) { return by_dtype[static_cast<int>(t)]; }
  const Counters& operator[](DType t) const { return by_dtype[static_cast<int>(t)]; }
  // Totals minus the sum of by_dtype: what no element type accounts for.
  Counters unattributed() const;
  void add(const OpStats& o);
};

struct Stats {
  std::string group;  // the group's name, e.g. "P" or "node"
  std::array<OpStats, kNumOps> ops{};

  OpStats& operator[](Op op) { return ops[static_cast<int>(op)]; }
  const OpStats& operator[](Op op) const { return ops[static_cast<int>(op)]; }
  OpStats total() const;
};

// Over the ranks of comm (collective): counts and bytes summed, times the max
// over ranks (the slowest rank is what a synchronous step waits for); the same
// for each element type.
Stats reduce_stats(const Stats& local, MPI_Comm comm);

// A fixed-width table, one row per (group, op, dtype) that was called, then
// the bytes sent per dtype over all groups when more than one dtype was used:
//   group  op  dtype  calls  sent  received  in-flight(ms)  exposed(ms)  exposed%
std::string format_stats(const std::vector<Stats>& stats);

}  // namespace amsp::comm
