#include "comm/stats.h"

#include <cstdio>

#include "core/mpi_check.h"

namespace amsp::comm {

Counters OpStats::unattributed() const {
  Counters u = *this;
  for (const Counters& d : by_dtype) {
    u.calls -= d.calls;
    u.bytes_sent -= d.bytes_sent;
    u.bytes_received -= d.bytes_received;
    u.in_flight_s -= d.in_flight_s;
    u.exposed_s -= d.exposed_s;
  }
  return u;
}

void OpStats::add(const OpStats& o) {
  Counters::add(o);
  for (int t = 0; t < kNumDTypes; ++t) by_dtype[t].add(o.by_dtype[t]);
}

OpStats Stats::total() const {
  OpStats t;
  for (const auto& o : ops) t.add(o);
  return t;
}

Stats reduce_stats(const Stats& local, MPI_Comm comm) {
  // Per op: the totals, then each dtype.
  constexpr int kSlots = kNumOps * (1 + kNumDTypes);
  int64_t counts[kSlots * 3];
  double times[kSlots * 2];
  const auto slot = [](auto& s, int i) -> auto& {
    auto& o = s.ops[i / (1 + kNumDTypes)];
    const int k = i % (1 + kNumDTypes);
    return k == 0 ? o : o.by_dtype[k - 1];
  };
  for (int i = 0; i < kSlots; ++i) {
    const Counters& c = slot(local, i);
    counts[3 * i] = c.calls;
    counts[3 * i + 1] = c.bytes_sent;
    counts[3 * i + 2] = c.bytes_received;
    times[2 * i] = c.in_flight_s;
    times[2 * i + 1] = c.exposed_s;
  }
  AMSP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, counts, kSlots * 3, MPI_INT64_T, MPI_SUM, comm));
  AMSP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, times, kSlots * 2, MPI_DOUBLE, MPI_MAX, comm));
  Stats out;
  out.group = local.group;
  for (int i = 0; i < kSlots; ++i) {
    Counters& c = slot(out, i);
    c.calls = counts[3 * i];
    c.bytes_sent = counts[3 * i + 1];
    c.bytes_received = counts[3 * i + 2];
    c.in_flight_s = times[2 * i];
    c.exposed_s = times[2 * i + 1];
  }
  return out;
}

namespace {

void row(std::string& out, const std::string& group, const char* op, const char* dtype,
         const Counters& o) {
  char line[256];
  const double pct = o.in_flight_s > 0 ? 100.0 * o.exposed_s / o.in_flight_s : 0.0;
  std::snprintf(line, sizeof line, "%-10s %-15s %-6s %8lld %14lld %14lld %14.3f %12.3f %8.1f%%\n",
                group.c_str(), op, dtype, static_cast<long long>(o.calls),
                static_cast<long long>(o.bytes_sent), static_cast<long long>(o.bytes_received),
                o.in_flight_s * 1e3, o.exposed_s * 1e3, pct);
  out += line;
}

}  // namespace

std::string format_stats(const std::vector<Stats>& stats) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-10s %-15s %-6s %8s %14s %14s %14s %12s %9s\n", "group",
                "op", "dtype", "calls", "sent(B)", "received(B)", "in-flight(ms)", "exposed(ms)",
                "exposed%");
  out += line;
  std::array<int64_t, kNumDTypes + 1> sent_by_dtype{};  // the last: unattributed
  for (const Stats& s : stats) {
    for (Op op : kAllOps) {
      const OpStats& o = s[op];
      if (o.calls == 0) continue;
      for (int t = 0; t < kNumDTypes; ++t) {
        if (o.by_dtype[t].calls == 0) continue;
        row(out, s.group, op_name(op), dtype_name(static_cast<DType>(t)), o.by_dtype[t]);
        sent_by_dtype[t] += o.by_dtype[t].bytes_sent;
      }
      const Counters u = o.unattributed();
      if (u.calls != 0 || u.bytes_sent != 0 || u.bytes_received != 0) {
        row(out, s.group, op_name(op), "-", u);
        sent_by_dtype[kNumDTypes] += u.bytes_sent;
      }
    }
  }
  int used = 0;
  for (int t = 0; t < kNumDTypes; ++t) used += sent_by_dtype[t] != 0;
  if (used > 1) {
    out += "sent by dtype:";
    for (int t = 0; t <= kNumDTypes; ++t) {
      if (!sent_by_dtype[t]) continue;
      std::snprintf(line, sizeof line, " %s %lld B", t < kNumDTypes ? dtype_name(static_cast<DType>(t)) : "-",
                    static_cast<long long>(sent_by_dtype[t]));
      out += line;
    }
    out += "\n";
  }
  return out;
}

}  // namespace amsp::comm
