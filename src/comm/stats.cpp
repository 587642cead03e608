#include "comm/stats.h"

#include <cstdio>

#include "comm/check.h"

namespace amsp::comm {

OpStats Stats::total() const {
  OpStats t;
  for (const auto& o : ops) {
    t.calls += o.calls;
    t.bytes_sent += o.bytes_sent;
    t.bytes_received += o.bytes_received;
    t.in_flight_s += o.in_flight_s;
    t.exposed_s += o.exposed_s;
  }
  return t;
}

Stats reduce_stats(const Stats& local, MPI_Comm comm) {
  int64_t counts[kNumOps * 3];
  double times[kNumOps * 2];
  for (int i = 0; i < kNumOps; ++i) {
    counts[3 * i] = local.ops[i].calls;
    counts[3 * i + 1] = local.ops[i].bytes_sent;
    counts[3 * i + 2] = local.ops[i].bytes_received;
    times[2 * i] = local.ops[i].in_flight_s;
    times[2 * i + 1] = local.ops[i].exposed_s;
  }
  AMSP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, counts, kNumOps * 3, MPI_INT64_T, MPI_SUM, comm));
  AMSP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, times, kNumOps * 2, MPI_DOUBLE, MPI_MAX, comm));
  Stats out;
  out.group = local.group;
  for (int i = 0; i < kNumOps; ++i) {
    out.ops[i] = {counts[3 * i], counts[3 * i + 1], counts[3 * i + 2], times[2 * i],
                  times[2 * i + 1]};
  }
  return out;
}

std::string format_stats(const std::vector<Stats>& stats) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-10s %-15s %8s %14s %14s %14s %12s %9s\n", "group", "op",
                "calls", "sent(B)", "received(B)", "in-flight(ms)", "exposed(ms)", "exposed%");
  out += line;
  for (const Stats& s : stats) {
    for (Op op : kAllOps) {
      const OpStats& o = s[op];
      if (o.calls == 0) continue;
      const double pct = o.in_flight_s > 0 ? 100.0 * o.exposed_s / o.in_flight_s : 0.0;
      std::snprintf(line, sizeof line, "%-10s %-15s %8lld %14lld %14lld %14.3f %12.3f %8.1f%%\n",
                    s.group.c_str(), op_name(op), static_cast<long long>(o.calls),
                    static_cast<long long>(o.bytes_sent), static_cast<long long>(o.bytes_received),
                    o.in_flight_s * 1e3, o.exposed_s * 1e3, pct);
      out += line;
    }
  }
  return out;
}

}  // namespace amsp::comm
