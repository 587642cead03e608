// The MPI backend: one FIFO of ops per communicator, run one at a time with
// MPI's non-blocking collectives, and progressed either by a communication
// thread shared by all communicators of the process or by the caller.
// Measurements and reasoning: doc/communication.md.
//
// fp32 and fp64 ops, and every op that only moves data (all-gather, broadcast, and
// all-to-all: MPI_Ialltoall in any dtype), are one MPI collective each. A bf16
// sum is done here rather than by MPI (which has no bf16 type, and whose
// algorithms would round at every hop in an order of their choosing): an op
// may therefore take several stages, an MPI collective each followed by local
// work, all run by the poller:
//   bf16 reduce-scatter  alltoall of the blocks; sum in fp32 in rank order, round
//   bf16 all-reduce      the same on ceil(count/n)-element blocks of a padded
//                        copy, then an in-place all-gather of the blocks
// Each rank's bytes are those of a ring (comm/traffic.h).

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/mismatch.h"
#include "core/error.h"
#include "core/mpi_check.h"
#include "core/parse.h"
#include "kernels/common/math.h"

namespace amsp::comm {
namespace {

Progress g_session_progress = Progress::kThread;

// How the communication thread waits between two polls that found nothing new.
// AMSP_COMM_POLL: a number of microseconds to sleep (default 50), "yield" or
// "spin". Sleeping leaves the cores to compute while an op is in flight;
// doc/communication.md has the measurements.
struct PollPolicy {
  enum Kind { kSpin, kYield, kSleep } kind = kSleep;
  int sleep_us = 50;
};

PollPolicy poll_policy() {
  static const PollPolicy policy = [] {
    PollPolicy p;
    const char* v = std::getenv("AMSP_COMM_POLL");
    if (!v || !*v) return p;
    const std::string s = v;
    if (s == "spin") {
      p.kind = PollPolicy::kSpin;
    } else if (s == "yield") {
      p.kind = PollPolicy::kYield;
    } else if (const auto us = parse_int(s); us && *us >= 0 && *us <= 1000000) {
      p.kind = PollPolicy::kSleep;
      p.sleep_us = static_cast<int>(*us);
    } else {
      fail_usage("AMSP_COMM_POLL=", s, ": expected microseconds to sleep, yield or spin");
    }
    return p;
  }();
  return policy;
}

void back_off(const PollPolicy& p) {
  switch (p.kind) {
    case PollPolicy::kSpin: break;
    case PollPolicy::kYield: sched_yield(); break;
    case PollPolicy::kSleep: std::this_thread::sleep_for(std::chrono::microseconds(p.sleep_us));
  }
}

class MpiCommunicator;

// The communication thread: polls every registered communicator while any
// has work, sleeps on a condition variable otherwise. Runs while at least one
// thread-mode communicator exists.
class Engine {
 public:
  static Engine& get() {
    static Engine engine;
    return engine;
  }
  void add(MpiCommunicator* c);
  void remove(MpiCommunicator* c);
  void notify() {
    {
      std::lock_guard lock(sleep_mu_);
      ++submitted_;
    }
    sleep_cv_.notify_one();
  }

 private:
  void run();

  std::mutex list_mu_;  // held for a whole polling pass
  std::vector<MpiCommunicator*> comms_;
  std::mutex sleep_mu_;
  std::condition_variable sleep_cv_;
  uint64_t submitted_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(Group group, Progress progress)
      : group_(std::move(group)),
        progress_(progress),
        backend_(cat("mpi/", progress_name(progress))),
        checking_(mismatch::enabled_from_env() && progress == Progress::kThread) {
    watch(group_);
    if (progress_ == Progress::kThread) Engine::get().add(this);
  }
  ~MpiCommunicator() override {
    synchronize();
    if (progress_ == Progress::kThread) Engine::get().remove(this);
  }

  const std::string& name() const override { return group_.name(); }
  int size() const override { return group_.size(); }
  int rank() const override { return group_.rank(); }
  const char* backend() const override { return backend_.c_str(); }

  // Starts queued ops and tests the one in flight, as far as it gets without
  // blocking. Called by exactly one thread: the engine's, or the caller's.
  // Returns {made progress, still has work}.
  std::pair<bool, bool> poll() {
    bool progressed = false;
    for (;;) {
      if (!current_) {
        std::lock_guard lock(mu_);
        if (queue_.empty()) return {progressed, false};
        current_ = queue_.front();
        queue_.pop_front();
      }
      if (req_ == MPI_REQUEST_NULL) {
        if (!current_->begun) {
          // A chained op waits here, on the poller, for its predecessor.
          if (!current_->args.after.test()) return {progressed, true};
          begin(*current_);
        }
        if (checking_ && !current_->checked) start_check(*current_);
        else start(*current_);
        progressed = true;
      }
      int flag = 0;
      AMSP_MPI_CHECK(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
      if (!flag) return {progressed, true};
      progressed = true;
      if (checking_ && !current_->checked) {
        finish_check(*current_);  // ends the job on a mismatch
        continue;                 // the op itself starts at once
      }
      if (finish_stage(*current_)) continue;  // the op's next MPI call starts at once
      run_local_on_host(current_->args.then);
      run_local_on_host(current_->args.and_then);
      record_completion(current_->seq, current_->args.op, current_->args.dtype,
                        now_seconds() - current_->t_issue);
      {
        std::lock_guard lock(mu_);
        done_seq_.store(current_->seq, std::memory_order_release);
      }
      cv_.notify_all();
      current_.reset();
      progressed = true;
    }
  }

 protected:
  uint64_t issue(const OpArgs& args) override {
    const uint64_t seq = next_seq_++;
    {
      std::lock_guard lock(mu_);
      queue_.push_back({seq, args, now_seconds()});
    }
    if (progress_ == Progress::kThread) {
      Engine::get().notify();
    } else {
      poll();  // start it now if the communicator is idle
    }
    return seq;
  }

  bool done(uint64_t seq) override {
    if (progress_ != Progress::kThread && done_seq_.load(std::memory_order_acquire) < seq) poll();
    return done_seq_.load(std::memory_order_acquire) >= seq;
  }

  void block_until(uint64_t seq, double deadline) override {
    if (progress_ == Progress::kThread) {
      std::unique_lock lock(mu_);
      while (done_seq_.load(std::memory_order_acquire) < seq) {
        cv_.wait_for(lock, std::chrono::milliseconds(100));
        if (deadline > 0 && now_seconds() > deadline &&
            done_seq_.load(std::memory_order_acquire) < seq) {
          lock.unlock();  // stuck_args takes it again
          timed_out(seq, stuck_args(seq));
        }
      }
      return;
    }
    // The caller is the progress engine (none), or shares MPI with MPICH's
    // progress thread (mpi-async): test, and let the other thread run.
    for (uint64_t n = 0; done_seq_.load(std::memory_order_acquire) < seq; ++n) {
      poll();
      if (progress_ == Progress::kMpiAsync) sched_yield();
      if (deadline > 0 && (n & 255) == 0 && now_seconds() > deadline &&
          done_seq_.load(std::memory_order_acquire) < seq)
        timed_out(seq, stuck_args(seq));
    }
  }

 private:
  struct Pending {
    uint64_t seq = 0;
    OpArgs args;
    double t_issue = 0;
    int stage = 0;       // MPI calls of the op completed so far
    bool begun = false;  // its predecessor completed and its `before` ran
    bool checked = false;  // the ranks agreed on what the op is
  };

  // --- the mismatch check (comm/mismatch.h) ----------------------------------
  // Before an op moves any data. AMSP_COMM_CHECK=0 turns it off (measured in
  // doc/communication.md). Only the communication thread runs it: in the other
  // progress modes nobody would start the op after its check until the caller
  // tests or waits, which would take away the overlap those modes exist for.
  void start_check(const Pending& p) {
    sig_ = mismatch::signature(identity_of(p.seq, p.args));
    AMSP_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, sig_.data(), 2, MPI_UINT64_T, MPI_MAX, group_.comm(), &req_));
  }

  void finish_check(Pending& p) {
    p.checked = true;
    const watchdog::Identity me = identity_of(p.seq, p.args);
    if (mismatch::agreed(sig_, me)) return;
    // Every rank of the group sees the mismatch; the check ran before the op,
    // so nothing of it reached the wire.
    const bool sums = p.args.op == Op::kReduceScatter || p.args.op == Op::kAllReduce;
    mismatch::report(watched(), rank(), group_.comm(), me, watchdog::step(),
                     sums ? "; nothing was reduced" : "; nothing was moved");
  }

  // A chained op's time in flight counts from the moment its predecessor
  // completed: the wait before is the predecessor's, not this op's.
  void begin(Pending& p) {
    p.begun = true;
    if (p.args.after.sequence() != 0) p.t_issue = std::max(p.t_issue, now_seconds());
    run_local_on_host(p.args.before);
  }

  OpArgs stuck_args(uint64_t seq) {
    std::lock_guard lock(mu_);
    for (const Pending& p : queue_)
      if (p.seq == seq) return p.args;
    return current_ ? current_->args : OpArgs{};
  }

  static MPI_Datatype mpi_type(DType t) {
    switch (t) {
      case DType::kF32: return MPI_FLOAT;
      case DType::kBF16: return MPI_UINT16_T;  // moved as bits; sums are ours
      case DType::kI32: return MPI_INT32_T;
      case DType::kF64: return MPI_DOUBLE;
    }
    return MPI_DATATYPE_NULL;
  }

  static bool sums_bf16(const OpArgs& a) {
    return a.dtype == DType::kBF16 && (a.op == Op::kReduceScatter || a.op == Op::kAllReduce);
  }

  // Starts the MPI call of p's current stage into req_.
  void start(const Pending& p) {
    const OpArgs& a = p.args;
    const MPI_Comm comm = group_.comm();
    const int n = static_cast<int>(a.count);
    const MPI_Datatype type = mpi_type(a.dtype);
    if (sums_bf16(a)) {
      start_bf16_sum(p);
      return;
    }
    switch (a.op) {
      case Op::kAllGather: {
        const bool in_place = static_cast<const char*>(a.send) ==
                              static_cast<const char*>(a.recv) + a.count * rank() * dtype_bytes(a.dtype);
        AMSP_MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : a.send, n, type, a.recv, n, type,
                                      comm, &req_));
        break;
      }
      case Op::kReduceScatter:
        AMSP_MPI_CHECK(MPI_Ireduce_scatter_block(a.send, a.recv, n, type, MPI_SUM, comm, &req_));
        break;
      case Op::kAllReduce:
        AMSP_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, a.recv, n, type, MPI_SUM, comm, &req_));
        break;
      case Op::kBroadcast:
        AMSP_MPI_CHECK(MPI_Ibcast(a.recv, n, type, a.root, comm, &req_));
        break;
      case Op::kAllToAll:  // moves only: the element type is just its size
        AMSP_MPI_CHECK(MPI_Ialltoall(a.send, n, type, a.recv, n, type, comm, &req_));
        break;
    }
  }

  // bf16 sums. Stage 0: every rank sends block r of its input to rank r
  // (alltoall), so each rank holds the n contributions to its own block, as
  // bf16: (n-1) blocks out and in, the bytes of a ring reduce-scatter. Stage 1
  // (all-reduce only): all-gather the summed blocks in place.
  void start_bf16_sum(const Pending& p) {
    const OpArgs& a = p.args;
    const int64_t n = size();
    const int64_t block = a.op == Op::kReduceScatter ? a.count : block_count(a.count, n);
    if (p.stage == 0) {
      const uint16_t* send = static_cast<const uint16_t*>(a.send);
      if (a.op == Op::kAllReduce && block * n != a.count) {
        // Pad a copy to n equal blocks; the summed blocks are gathered in it.
        padded_.assign(static_cast<size_t>(block * n), 0);
        std::copy_n(send, a.count, padded_.begin());
        send = padded_.data();
      }
      blocks_.resize(static_cast<size_t>(block * n));
      AMSP_MPI_CHECK(MPI_Ialltoall(send, static_cast<int>(block), MPI_UINT16_T, blocks_.data(),
                                   static_cast<int>(block), MPI_UINT16_T, group_.comm(), &req_));
      return;
    }
    AMSP_MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, static_cast<int>(block), MPI_UINT16_T,
                                  gather_target(a), static_cast<int>(block), MPI_UINT16_T,
                                  group_.comm(), &req_));
  }

  // Where a bf16 all-reduce gathers its blocks: the caller's buffer when the
  // count splits evenly, else the padded copy.
  uint16_t* gather_target(const OpArgs& a) {
    return a.count % size() == 0 ? static_cast<uint16_t*>(a.recv) : padded_.data();
  }

  // Local work after the MPI call of p's current stage completed. Returns true
  // when the op has another stage (then req_ is free to start it).
  bool finish_stage(Pending& p) {
    const OpArgs& a = p.args;
    if (!sums_bf16(a)) return false;
    const int64_t n = size();
    if (p.stage == 0) {
      const int64_t block = a.op == Op::kReduceScatter ? a.count : block_count(a.count, n);
      uint16_t* out = a.op == Op::kReduceScatter ? static_cast<uint16_t*>(a.recv)
                                                 : gather_target(a) + rank() * block;
      sum_blocks_bf16(blocks_.data(), n, block, out);
      if (a.op == Op::kReduceScatter) return false;
      p.stage = 1;
      return true;
    }
    if (a.count % n != 0)
      std::copy_n(padded_.begin(), a.count, static_cast<uint16_t*>(a.recv));
    return false;
  }

  // out[i] = bf16 of (blocks[0][i] + blocks[1][i] + ... + blocks[n-1][i])
  // summed in fp32 in that order: one rounding, the same on every rank.
  void sum_blocks_bf16(const uint16_t* blocks, int64_t n, int64_t block, uint16_t* out) {
    acc_.resize(static_cast<size_t>(block));
    for (int64_t i = 0; i < block; ++i) acc_[i] = kernels::bf16_to_float(blocks[i]);
    for (int64_t r = 1; r < n; ++r) {
      const uint16_t* b = blocks + r * block;
      for (int64_t i = 0; i < block; ++i) acc_[i] += kernels::bf16_to_float(b[i]);
    }
    for (int64_t i = 0; i < block; ++i) out[i] = kernels::float_to_bf16(acc_[i]);
  }

  Group group_;
  Progress progress_;
  std::string backend_;
  bool checking_;  // the mismatch check is on
  uint64_t next_seq_ = 1;  // the issuing thread's

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> queue_;  // issued, not started
  std::atomic<uint64_t> done_seq_{0};

  // The poller's: the op in flight, and the scratch of bf16 sums.
  std::optional<Pending> current_;
  MPI_Request req_ = MPI_REQUEST_NULL;
  std::vector<uint16_t> blocks_;  // the n contributions to this rank's block
  std::vector<uint16_t> padded_;  // an all-reduce's buffer padded to n blocks
  std::vector<float> acc_;        // the fp32 sums
  mismatch::Signature sig_{};     // the mismatch check's, reduced in place
};

void Engine::add(MpiCommunicator* c) {
  std::lock_guard lock(list_mu_);
  comms_.push_back(c);
  if (!thread_.joinable()) {
    {
      std::lock_guard s(sleep_mu_);
      stop_ = false;
    }
    thread_ = std::thread([this] { run(); });
  }
}

void Engine::remove(MpiCommunicator* c) {
  std::thread finished;
  {
    std::lock_guard lock(list_mu_);
    std::erase(comms_, c);
    if (comms_.empty() && thread_.joinable()) {
      {
        std::lock_guard s(sleep_mu_);
        stop_ = true;
      }
      sleep_cv_.notify_one();
      finished = std::move(thread_);
    }
  }
  if (finished.joinable()) finished.join();
}

void Engine::run() {
  // The Locals this thread runs (the compressed collectives' quantization
  // among them) stay on it: the ranks' compute threads own the cores, and an
  // OpenMP team per poller would oversubscribe them.
  omp_set_num_threads(1);
  const PollPolicy policy = poll_policy();
  for (;;) {
    uint64_t seen = 0;
    {
      std::lock_guard lock(sleep_mu_);
      if (stop_) return;
      seen = submitted_;
    }
    bool progressed = false, busy = false;
    {
      std::lock_guard lock(list_mu_);
      for (MpiCommunicator* c : comms_) {
        const auto [p, b] = c->poll();
        progressed |= p;
        busy |= b;
      }
    }
    if (!busy) {
      std::unique_lock lock(sleep_mu_);
      sleep_cv_.wait(lock, [&] { return stop_ || submitted_ != seen; });
    } else if (!progressed) {
      back_off(policy);
    }
  }
}

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(Group group, Progress progress) {
  if (!group.valid()) abort_job("make_mpi_communicator: an empty group");
  return std::make_unique<MpiCommunicator>(std::move(group), progress);
}

std::unique_ptr<Communicator> make_mpi_communicator(Group group) {
  return make_mpi_communicator(std::move(group), g_session_progress);
}

Progress session_progress() { return g_session_progress; }

MpiSession::MpiSession(int* argc, char*** argv) : progress_(progress_from_env()) {
  // MPICH reads its control variables in MPI_Init.
  if (progress_ == Progress::kMpiAsync) setenv("MPICH_ASYNC_PROGRESS", "1", 1);
  int provided = 0;
  AMSP_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  if (provided < MPI_THREAD_MULTIPLE)
    abort_job(cat("the MPI library provides thread level ", provided,
                  "; amsp's communication layer needs MPI_THREAD_MULTIPLE (", MPI_THREAD_MULTIPLE,
                  ")"));
  g_session_progress = progress_;
  // The watchdog's responder calls MPI from a thread of its own, which would
  // progress the ops of every communicator: not in `none`, whose ops progress
  // only inside the caller's test and wait.
  if (progress_ != Progress::kNone) watchdog::start();
}

MpiSession::~MpiSession() {
  watchdog::stop();
  AMSP_MPI_CHECK(MPI_Finalize());
}

}  // namespace amsp::comm
