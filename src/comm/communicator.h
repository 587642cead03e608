// Asynchronous collectives on one group, like a CUDA stream: every call issues
// an operation and returns a Handle at once; operations issued on one
// communicator run one after another in issue order (op k+1 starts after op k
// completes, so it may read what op k wrote), and waiting on op k implies that
// every earlier op on the communicator is done. Different communicators run
// concurrently.
//
// Buffers are contiguous arrays of one element type (core/dtype.h: fp32 by
// default, bf16, int32, fp64), in host memory for the MPI backend and device memory
// for the NCCL one, and must stay untouched until the op completes. Counts are
// in elements of that type.
//
//   all_gather(send, c, recv)      recv[i*c .. (i+1)*c) = send of group rank i;
//                                  send may be recv + rank*c (in place)
//   reduce_scatter(send, c, recv)  recv[0..c) = sum over ranks of send[rank*c ..
//                                  (rank+1)*c); send holds c * size elements
//   all_reduce(buf, n)             buf = sum over ranks of buf (in place)
//   broadcast(buf, n, root)        buf = root's buf
//   all_to_all(send, c, recv)      recv[i*c .. (i+1)*c) = send[rank*c .. (rank+1)*c)
//                                  of group rank i; send and recv hold c * size
//                                  elements each and must not overlap
//
// Every rank of the group must issue the same ops in the same order with the
// same counts and dtypes. Zero counts are fine.
//
// Sums of bf16 accumulate in fp32 and round to bf16 once. On the MPI backend
// the result is, for every element, round_bf16 of the fp32 sum over group ranks
// 0, 1, ..., n-1 in that order: the same on every rank and whatever algorithm
// MPI picks (doc/communication.md, "Element types"). fp64 is for a few
// statistics (the gradient norm's partial sums). int32 is for moving data
// (all-gather, broadcast, all-to-all: opaque records as int32 words); reducing
// it throws amsp::Error. all-to-all only moves data and takes every dtype.
// all-gather, reduce-scatter and all-to-all take equal blocks: callers pad
// (comm/traffic.h: padded_count, real_part_of_block).
//
// The operations themselves are not thread-safe against each other on one
// communicator: issue, test and wait from one thread at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "comm/group.h"
#include "comm/stats.h"
#include "comm/traffic.h"
#include "comm/watchdog.h"
#include "core/dtype.h"
#include "kernels/common/quant.h"

namespace amsp::comm {

// The default time a collective may take before the job is aborted: the
// environment variable AMSP_COMM_TIMEOUT (seconds, 0: wait forever), else 600.
// UsageError naming the variable if it is not a number >= 0.
double default_comm_timeout_s();

class Communicator;

// One issued operation. A default-constructed Handle is complete.
class Handle {
 public:
  Handle() = default;
  // Blocks until this op and every op issued before it on its communicator
  // have completed; the time spent here is the op's exposed time. A wait that
  // exceeds the communicator's timeout aborts the job.
  void wait();
  // True when wait() would return at once. Never blocks.
  bool test();
  // Makes the compute stream of the backend the communicator was made for
  // wait until this op (and the ops before it) completed. On a device that is
  // a wait on the GPU: the host goes on, and the time the stream stalls is
  // the op's exposed time, measured with device events. On the CPU backend,
  // whose compute is the host, it is wait().
  void compute_wait();
  uint64_t sequence() const { return seq_; }  // 1, 2, ... per communicator; 0: none
  Communicator* communicator() const { return comm_; }

 private:
  friend class Communicator;
  Handle(Communicator* comm, uint64_t seq, Op op, DType dtype)
      : comm_(comm), seq_(seq), op_(op), dtype_(dtype) {}
  Communicator* comm_ = nullptr;  // must outlive the handle
  uint64_t seq_ = 0;
  Op op_ = Op::kAllReduce;
  DType dtype_ = DType::kF32;
};

// Elementwise work a communicator does around an op, in its order and on its
// own stream (the poller's thread on MPI, the communicator's CUDA stream on
// NCCL): add sets dst = dst + src, summed in fp32 and stored in dst's dtype;
// copy sets dst = src converted to dst's dtype (fp32 or bf16; bf16 rounds to
// nearest even). The same arithmetic as Backend::add and Backend::copy, so
// moving work here changes no bit. Not a collective: Stats do not count it.
//
// The quantizing kinds are the compressed collectives' ends (doc/compression.md,
// kernels/common/quant.h), with Backend::quantize's arithmetic: quantize turns
// `records` chunks of `count` values of src (fp32 or bf16) into as many records
// in dst (int32 words); dequantize turns `records` records of src into as many
// chunks of `count` values of dst; dequantize_sum sums `records` records of src,
// in record order, into one chunk of `count` values of dst.
struct Local {
  enum Kind { kNone, kAdd, kCopy, kQuantize, kDequantize, kDequantizeSum } kind = kNone;
  const void* src = nullptr;
  DType src_dtype = DType::kF32;
  void* dst = nullptr;
  DType dst_dtype = DType::kF32;
  int64_t count = 0;    // values (per record, for the quantizing kinds)
  int64_t records = 1;  // the quantizing kinds' records
  kernels::quant::Spec spec;
  bool quantizing() const { return kind == kQuantize || kind == kDequantize || kind == kDequantizeSum; }
  // Bytes the Local reads from src and writes to dst.
  int64_t src_bytes() const;
  int64_t dst_bytes() const;
};
// Runs a Local on host memory (the MPI backend's poller).
void run_local_on_host(const Local& l);

// What an op was asked to do; backends see it in issue(). (Declared below.)
struct OpArgs;
// What the mismatch check compares of op `seq` (comm/watchdog.h, Identity).
watchdog::Identity identity_of(uint64_t seq, const OpArgs& a);

// What an op was asked to do; backends see it in issue().
struct OpArgs {
  Op op = Op::kAllReduce;
  const void* send = nullptr;
  void* recv = nullptr;  // also the buffer of all-reduce and broadcast
  int64_t count = 0;     // elements: per rank for all-gather / reduce-scatter / all-to-all, else the buffer
  int root = 0;
  DType dtype = DType::kF32;
  // Chaining, for the stages of one gradient reduction: the op starts only once
  // `after` (an op of the same backend issued earlier; on this communicator it
  // is ordered already) has completed, without the caller waiting for it; then
  // `before` runs, then the op, then `then`, and only then does the op count as
  // complete.
  Handle after;
  Local before, then;
  // A second step after `then` (a compressed reduction: its sum, then the add
  // into the accumulator); part of the op like `then`.
  Local and_then;
  // Set by submit: the op's position in the trainer's step (watchdog::next_op_index),
  // compared across ranks by the mismatch check (comm/mismatch.h); -1 outside a step.
  int64_t position = -1;
};

// The interface both backends implement. Accounting (comm/stats.h) and the
// wait timeout live here so that the backends agree on them.
class Communicator {
 public:
  virtual ~Communicator() = default;

  // `dtype` says what the buffers hold (fp32 when omitted, so float callers
  // read as before); bf16 buffers are uint16_t bit patterns (kernels/common/math.h).
  Handle all_gather(const void* send, int64_t count_per_rank, void* recv,
                    DType dtype = DType::kF32);
  Handle reduce_scatter(const void* send, int64_t count_per_rank, void* recv,
                        DType dtype = DType::kF32);
  Handle all_reduce(void* buf, int64_t count, DType dtype = DType::kF32);
  Handle broadcast(void* buf, int64_t count, int root, DType dtype = DType::kF32);
  // Block i of `send` goes to group rank i; block i of `recv` comes from it.
  // Not in place: overlapping buffers throw amsp::Error before anything is
  // issued or counted.
  Handle all_to_all(const void* send, int64_t count_per_rank, void* recv,
                    DType dtype = DType::kF32);
  // Any op, with its chaining (OpArgs).
  Handle submit(const OpArgs& args);

  // Waits for everything issued so far (exposed time goes to the last op).
  void synchronize();
  // Host waits so far (Handle::wait and synchronize calls, whether or not the
  // op had already completed): on a device, each would stall the host.
  int64_t host_waits() const { return host_waits_.load(std::memory_order_relaxed); }

  virtual const std::string& name() const = 0;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  virtual const char* backend() const = 0;  // "mpi/thread", "nccl", ...

  Stats stats() const;
  void reset_stats();

  // Observer of timing, for traces: called with (op, seq, start, end, waited)
  // in now_seconds() time when op number seq completes (waited = false: start
  // is its issue) and when a caller's wait for it returns (waited = true: the
  // blocked span). Called from the backend's thread for completions: must be
  // thread-safe.
  using TraceFn =
      std::function<void(Op op, uint64_t seq, double start_s, double end_s, bool waited)>;
  void set_trace(TraceFn fn) {
    std::lock_guard lock(stats_mu_);
    trace_ = std::move(fn);
  }

  // A wait blocked longer than this ends the job naming the rank that holds
  // the op up (comm/watchdog.h). 0 waits forever. Default: AMSP_COMM_TIMEOUT
  // seconds, else 600.
  void set_timeout(double seconds) { timeout_s_ = seconds; }
  double timeout() const { return timeout_s_; }

 protected:
  Communicator();
  // Starts or queues the op; returns its sequence number (1, 2, ... in issue order).
  virtual uint64_t issue(const OpArgs& args) = 0;
  // Has every op with sequence <= seq completed? Never blocks.
  virtual bool done(uint64_t seq) = 0;
  // Blocks until done(seq); past `deadline` (a now_seconds() value, 0: none)
  // calls timed_out().
  virtual void block_until(uint64_t seq, double deadline) = 0;

  // For backends: op number seq completed after `in_flight_s` seconds.
  void record_completion(uint64_t seq, Op op, DType dtype, double in_flight_s);
  // For backends: compute waited `seconds` for an op (Handle::compute_wait).
  void record_exposed(Op op, DType dtype, double seconds);
  // Handle::compute_wait; the default, for backends whose compute is the host,
  // waits on the host.
  virtual void order_compute_after(uint64_t seq, Op op, DType dtype) { wait_for(seq, op, dtype); }
  // For backends, in their constructor: registers the group with the watchdog.
  void watch(const Group& group);
  const watchdog::Entry& watched() const { return *entry_; }  // after watch()
  // For backends: the wait for op seq timed out. Asks the group's other
  // members what holds it up and ends the job naming them (watchdog::hang).
  [[noreturn]] void timed_out(uint64_t seq, const OpArgs& args) const;

 private:
  friend class Handle;
  void wait_for(uint64_t seq, Op op, DType dtype);

  std::unique_ptr<watchdog::Entry> entry_;  // set by watch()
  int world_rank_ = 0;
  mutable std::mutex stats_mu_;
  Stats stats_;
  TraceFn trace_;
  double timeout_s_ = default_comm_timeout_s();
  uint64_t last_seq_ = 0;
  std::atomic<int64_t> host_waits_{0};
  Op last_op_ = Op::kAllReduce;
  DType last_dtype_ = DType::kF32;
};

// Seconds on a monotonic clock.
double now_seconds();

// --- the MPI backend ---------------------------------------------------------

// How MPI collectives make progress while the caller computes (doc/communication.md):
//   thread     a communication thread of this process owns the MPI calls of every
//              communicator: it starts each op and polls it to completion (default)
//   mpi-async  MPI_I* from the caller, progressed by MPICH's own progress thread
//              (MPICH_ASYNC_PROGRESS=1, set by MpiSession)
//   none       MPI_I* from the caller, progressed only inside test and wait
enum class Progress { kThread, kMpiAsync, kNone };
const char* progress_name(Progress p);
std::optional<Progress> parse_progress(const std::string& text);
// AMSP_COMM_PROGRESS, else thread. Throws UsageError on an unknown value.
Progress progress_from_env();

// Owns the group. Destroy communicators before MPI_Finalize; destruction waits
// for outstanding ops.
std::unique_ptr<Communicator> make_mpi_communicator(Group group, Progress progress);
// With the progress mode MpiSession initialised MPI for.
std::unique_ptr<Communicator> make_mpi_communicator(Group group);

// MPI for the life of a command, initialised for the comm layer: reads the
// progress mode from AMSP_COMM_PROGRESS, exports MPICH_ASYNC_PROGRESS=1 for
// mpi-async, and requires MPI_THREAD_MULTIPLE (the communication thread and
// the caller both call MPI). Finalises on destruction.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  Progress progress() const { return progress_; }

 private:
  Progress progress_;
};

// The mode of the current MpiSession (thread when none was created).
Progress session_progress();

}  // namespace amsp::comm
