#include "comm/communicator.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "core/mpi_check.h"
#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "core/fault.h"
#include "core/parse.h"
#include "kernels/common/math.h"

namespace amsp::comm {

double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

void Handle::wait() {
  if (comm_ && seq_) comm_->wait_for(seq_, op_, dtype_);
}

bool Handle::test() { return !comm_ || !seq_ || comm_->done(seq_); }

void Handle::compute_wait() {
  if (comm_ && seq_) comm_->order_compute_after(seq_, op_, dtype_);
}

double default_comm_timeout_s() {
  const char* t = std::getenv("AMSP_COMM_TIMEOUT");
  if (!t || !*t) return 600;
  const auto v = parse_double(t);
  if (!v || *v < 0) fail_usage("AMSP_COMM_TIMEOUT=", t, ": expected seconds >= 0 (0: no timeout)");
  return *v;
}

namespace {

// dst[i] = (add ? dst[i] + src[i] : src[i]) in fp32, stored in Dst; one loop per
// dtype pair, so that the compiler vectorises it.
template <typename Src, typename Dst>
void local_loop(const Src* src, Dst* dst, int64_t n, bool add) {
  auto load = [](auto v) {
    if constexpr (std::is_same_v<decltype(v), uint16_t>)
      return kernels::bf16_to_float(v);
    else
      return v;
  };
  auto store = [](float v) {
    if constexpr (std::is_same_v<Dst, uint16_t>)
      return kernels::float_to_bf16(v);
    else
      return v;
  };
  if (add)
    for (int64_t i = 0; i < n; ++i) dst[i] = store(load(dst[i]) + load(src[i]));
  else
    for (int64_t i = 0; i < n; ++i) dst[i] = store(load(src[i]));
}

}  // namespace

int64_t Local::src_bytes() const {
  if (kind == kDequantize || kind == kDequantizeSum)
    return records * kernels::quant::record_bytes(count, spec);
  return records * count * dtype_bytes(src_dtype);
}

int64_t Local::dst_bytes() const {
  if (kind == kQuantize) return records * kernels::quant::record_bytes(count, spec);
  return (kind == kDequantizeSum ? 1 : records) * count * dtype_bytes(dst_dtype);
}

namespace {

// The quantizing kinds of a Local, with the CPU kernels (kernels/cpu/quant.cpp).
void run_quant_on_host(const Local& l) {
  const bool s16 = l.src_dtype == DType::kBF16, d16 = l.dst_dtype == DType::kBF16;
  const auto* words = static_cast<const int32_t*>(l.src);
  switch (l.kind) {
    case Local::kQuantize:
      if (s16) kernels::quantize(static_cast<const uint16_t*>(l.src), l.count, l.records, l.spec,
                                 static_cast<int32_t*>(l.dst));
      else kernels::quantize(static_cast<const float*>(l.src), l.count, l.records, l.spec,
                             static_cast<int32_t*>(l.dst));
      break;
    case Local::kDequantize:
      if (d16) kernels::dequantize(words, l.count, l.records, l.spec, static_cast<uint16_t*>(l.dst));
      else kernels::dequantize(words, l.count, l.records, l.spec, static_cast<float*>(l.dst));
      break;
    case Local::kDequantizeSum:
      if (d16) kernels::dequantize_sum(words, l.count, l.records, l.spec, static_cast<uint16_t*>(l.dst));
      else kernels::dequantize_sum(words, l.count, l.records, l.spec, static_cast<float*>(l.dst));
      break;
    default: break;
  }
}

}  // namespace

void run_local_on_host(const Local& l) {
  if (l.kind == Local::kNone || l.count == 0) return;
  if (l.quantizing()) {
    run_quant_on_host(l);
    return;
  }
  const bool s16 = l.src_dtype == DType::kBF16, d16 = l.dst_dtype == DType::kBF16;
  if (l.src_dtype != DType::kF32 && !s16) fail("local ", dtype_name(l.src_dtype), ": fp32 or bf16 only");
  if (l.dst_dtype != DType::kF32 && !d16) fail("local ", dtype_name(l.dst_dtype), ": fp32 or bf16 only");
  const bool add = l.kind == Local::kAdd;
  const auto* sf = static_cast<const float*>(l.src);
  const auto* sb = static_cast<const uint16_t*>(l.src);
  auto* df = static_cast<float*>(l.dst);
  auto* db = static_cast<uint16_t*>(l.dst);
  if (!s16 && !d16) local_loop(sf, df, l.count, add);
  if (s16 && !d16) local_loop(sb, df, l.count, add);
  if (!s16 && d16) local_loop(sf, db, l.count, add);
  if (s16 && d16) local_loop(sb, db, l.count, add);
}

namespace {

// AMSP_COMM_ISSUE_LOG=DIR: every op issued through a communicator of this
// process is appended, in issue order, as "group op count dtype" to
// DIR/issues.RANK (the MPI world rank), for the tests of the issue order
// (doc/engine-tests.md). Off, it costs one branch per op.
class IssueLog {
 public:
  static IssueLog& get() {
    static IssueLog log;
    return log;
  }
  void write(const std::string& group, Op op, int64_t count, DType dtype) {
    if (!file_) return;
    std::lock_guard lock(mu_);
    std::fprintf(file_, "%s %s %lld %s\n", group.c_str(), op_name(op), static_cast<long long>(count),
                 dtype_name(dtype));
    std::fflush(file_);
  }

 private:
  IssueLog() {
    const char* dir = std::getenv("AMSP_COMM_ISSUE_LOG");
    if (!dir || !*dir) return;
    int rank = 0;
    AMSP_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    const std::string path = cat(dir, "/issues.", rank);
    file_ = std::fopen(path.c_str(), "w");
    if (!file_) fail_usage("AMSP_COMM_ISSUE_LOG=", dir, ": cannot write ", path);
  }
  std::mutex mu_;
  std::FILE* file_ = nullptr;
};

}  // namespace

watchdog::Identity identity_of(uint64_t seq, const OpArgs& a) {
  return {static_cast<int64_t>(seq), static_cast<int64_t>(a.op), a.count, static_cast<int64_t>(a.dtype),
          a.op == Op::kBroadcast ? a.root : 0, a.position};
}

Communicator::Communicator() {
  int init = 0;
  MPI_Initialized(&init);
  if (init) AMSP_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_));
}

void Communicator::watch(const Group& group) {
  MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  AMSP_MPI_CHECK(MPI_Comm_group(group.comm(), &mine));
  AMSP_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
  std::vector<int> local(static_cast<size_t>(group.size())), global(local.size());
  for (int i = 0; i < group.size(); ++i) local[i] = i;
  AMSP_MPI_CHECK(MPI_Group_translate_ranks(mine, group.size(), local.data(), world, global.data()));
  AMSP_MPI_CHECK(MPI_Group_free(&mine));
  AMSP_MPI_CHECK(MPI_Group_free(&world));
  entry_ = std::make_unique<watchdog::Entry>(group.name(), std::move(global));
}

namespace {
OpArgs args_of(Op op, const void* send, void* recv, int64_t count, int root, DType dtype) {
  OpArgs a;
  a.op = op;
  a.send = send;
  a.recv = recv;
  a.count = count;
  a.root = root;
  a.dtype = dtype;
  return a;
}
}  // namespace

Handle Communicator::all_gather(const void* send, int64_t count_per_rank, void* recv,
                                DType dtype) {
  return submit(args_of(Op::kAllGather, send, recv, count_per_rank, 0, dtype));
}
Handle Communicator::reduce_scatter(const void* send, int64_t count_per_rank, void* recv,
                                    DType dtype) {
  return submit(args_of(Op::kReduceScatter, send, recv, count_per_rank, 0, dtype));
}
Handle Communicator::all_reduce(void* buf, int64_t count, DType dtype) {
  return submit(args_of(Op::kAllReduce, buf, buf, count, 0, dtype));
}
Handle Communicator::broadcast(void* buf, int64_t count, int root, DType dtype) {
  return submit(args_of(Op::kBroadcast, buf, buf, count, root, dtype));
}

Handle Communicator::all_to_all(const void* send, int64_t count_per_rank, void* recv,
                                DType dtype) {
  return submit(args_of(Op::kAllToAll, send, recv, count_per_rank, 0, dtype));
}

Handle Communicator::submit(const OpArgs& asked) {
  OpArgs a = asked;
  a.position = watchdog::next_op_index();
  switch (fault::collective(watchdog::step(), a.position, world_rank_)) {
    case fault::Collective::kSkip: return Handle();  // as if the caller never issued it
    case fault::Collective::kShort: a.count = std::max<int64_t>(0, a.count - 1); break;
    case fault::Collective::kNone: break;
  }
  // Refused before anything is issued or counted; every rank of the group
  // makes the same call, so every rank throws.
  const bool reduces = a.op == Op::kReduceScatter || a.op == Op::kAllReduce;
  if (reduces && a.dtype == DType::kI32)
    fail(op_name(a.op), " on group ", name(), ": cannot sum ", dtype_name(a.dtype),
         " elements; reductions take fp32, bf16 or fp64 (", dtype_name(a.dtype),
         " is for all_gather, broadcast and all_to_all)");
  if (a.count < 0 || a.count > INT_MAX)
    abort_job(cat(op_name(a.op), " on group ", name(), ": count ", a.count,
                  " outside [0, INT_MAX]"));
  if (a.op == Op::kAllToAll && a.count > 0) {
    // Each rank's block would be overwritten while it is still being sent.
    const auto* s = static_cast<const char*>(a.send);
    const auto* r = static_cast<const char*>(a.recv);
    const int64_t bytes = a.count * size() * dtype_bytes(a.dtype);
    if (s < r + bytes && r < s + bytes)
      fail("all_to_all on group ", name(), ": send and recv overlap (", bytes,
           " bytes each); all_to_all is not in place");
  }
  if (a.op == Op::kBroadcast && (a.root < 0 || a.root >= size()))
    abort_job(cat("broadcast on group ", name(), ": root ", a.root, " outside the group of ",
                  size()));
  const Traffic t = traffic_bytes(a.op, a.count, size(), rank(), a.root, dtype_bytes(a.dtype));
  {
    std::lock_guard lock(stats_mu_);
    OpStats& s = stats_[a.op];
    for (Counters* c : {static_cast<Counters*>(&s), &s[a.dtype]}) {
      ++c->calls;
      c->bytes_sent += t.sent;
      c->bytes_received += t.received;
    }
  }
  IssueLog::get().write(name(), a.op, a.count, a.dtype);
  // Counted before issue: a backend may block in it (the NCCL emulation runs the
  // op there), and peers asking meanwhile must learn that this rank reached it.
  if (entry_) entry_->set_issued(entry_->issued() + 1);
  const uint64_t seq = issue(a);
  if (entry_) entry_->record(identity_of(seq, a));
  last_seq_ = seq;
  last_op_ = a.op;
  last_dtype_ = a.dtype;
  return Handle(this, seq, a.op, a.dtype);
}

void Communicator::synchronize() {
  if (last_seq_) wait_for(last_seq_, last_op_, last_dtype_);
}

void Communicator::wait_for(uint64_t seq, Op op, DType dtype) {
  host_waits_.fetch_add(1, std::memory_order_relaxed);
  if (done(seq)) return;
  const double t0 = now_seconds();
  {
    std::optional<watchdog::Waiting> waiting;
    if (entry_) waiting.emplace(*entry_, op, seq);
    block_until(seq, timeout_s_ > 0 ? t0 + timeout_s_ : 0.0);
  }
  const double t1 = now_seconds();
  record_exposed(op, dtype, t1 - t0);
  std::lock_guard lock(stats_mu_);
  if (trace_) trace_(op, seq, t0, t1, true);
}

void Communicator::record_exposed(Op op, DType dtype, double seconds) {
  std::lock_guard lock(stats_mu_);
  stats_[op].exposed_s += seconds;
  stats_[op][dtype].exposed_s += seconds;
}

void Communicator::record_completion(uint64_t seq, Op op, DType dtype, double in_flight_s) {
  std::lock_guard lock(stats_mu_);
  stats_[op].in_flight_s += in_flight_s;
  stats_[op][dtype].in_flight_s += in_flight_s;
  if (trace_) {
    const double now = now_seconds();
    trace_(op, seq, now - in_flight_s, now, false);
  }
}

Stats Communicator::stats() const {
  std::lock_guard lock(stats_mu_);
  Stats s = stats_;
  s.group = name();
  return s;
}

void Communicator::reset_stats() {
  std::lock_guard lock(stats_mu_);
  stats_ = Stats{};
}

void Communicator::timed_out(uint64_t seq, const OpArgs& a) const {
  if (entry_) watchdog::hang(*entry_, a.op, seq, timeout_s_);
  abort_job(cat("timeout: ", op_name(a.op), " (op #", seq, ", count ", a.count,
                a.dtype == DType::kF32 ? "" : cat(" ", dtype_name(a.dtype)), ") on group ",
                name(), " (", size(), " ranks, backend ", backend(),
                ") did not complete within ", timeout_s_,
                " s; another rank of the group is probably stuck or dead "
                "(set AMSP_COMM_TIMEOUT to change the limit)"));
}

const char* progress_name(Progress p) {
  switch (p) {
    case Progress::kThread: return "thread";
    case Progress::kMpiAsync: return "mpi-async";
    case Progress::kNone: return "none";
  }
  return "?";
}

std::optional<Progress> parse_progress(const std::string& text) {
  for (Progress p : {Progress::kThread, Progress::kMpiAsync, Progress::kNone})
    if (text == progress_name(p)) return p;
  return std::nullopt;
}

Progress progress_from_env() {
  const char* v = std::getenv("AMSP_COMM_PROGRESS");
  if (!v || !*v) return Progress::kThread;
  const auto p = parse_progress(v);
  if (!p) fail_usage("AMSP_COMM_PROGRESS=", v, ": expected thread, mpi-async or none");
  return *p;
}

}  // namespace amsp::comm
