// The NCCL backend of the communicator interface (comm/communicator.h), in
// every build: against real NCCL with -DAMSP_CUDA=ON, against the emulation
// of NCCL over MPI (kernels/cuda/api.h) otherwise, so that the CUDA backend's
// tests run it on the CPU. Buffers are device memory, of the op's dtype
// (ncclFloat32, ncclBfloat16, ncclInt32, ncclFloat64). Each communicator has
// its own CUDA stream: an op first waits (on the GPU) for everything issued so
// far on the compute stream, so it sees the gradients compute just wrote, and
// the stream keeps ops in issue order. Handle::wait blocks the host until the
// op's completion event; Handle::compute_wait makes the compute stream wait on
// the GPU instead (stream_wait: any stream), which is how the engine consumes
// an all-gathered unit.
//
// The mismatch check (comm/mismatch.h) runs beside the ops, never in front of
// them: issue() posts each op's check, a non-blocking all-reduce over a copy
// of the group's MPI communicator, and the watcher thread completes the checks
// in order; one that fails ends the job naming the ranks that issued something
// else, while the GPU may still be inside the op (NCCL's undefined behaviour
// for mismatched calls is usually a hang). AMSP_COMM_CHECK=0 turns it off.
//
// Errors. An NCCL error, returned when an op is issued or reported by
// ncclCommGetAsyncError when an op completes or while the host waits, and a
// wait past the timeout, abort the NCCL communicator (ncclCommAbort, so that
// no peer stays blocked on it) and end the job with one line naming the rank,
// the group and the op.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/group.h"
#include "comm/mismatch.h"
#include "kernels/cuda/api.h"

namespace amsp::comm {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over the group's ranks: rank 0 of the group creates the NCCL
  // unique id and broadcasts it over the group's MPI communicator. The current
  // CUDA device must already be set (topology's GpuInfo::device).
  NcclCommunicator(Group group, cudaStream_t compute);
  ~NcclCommunicator() override;

  const std::string& name() const override { return group_.name(); }
  int size() const override { return group_.size(); }
  int rank() const override { return group_.rank(); }
  const char* backend() const override { return "nccl"; }

  // Makes `stream` wait, on the GPU, until h's op (and the ops before it) are
  // done. Does not block the host and does not count as exposed time.
  void stream_wait(const Handle& h, cudaStream_t stream);
  cudaStream_t stream() const { return stream_; }

 protected:
  uint64_t issue(const OpArgs& args) override;
  bool done(uint64_t seq) override;
  void block_until(uint64_t seq, double deadline) override;
  // The compute stream waits on the GPU; events around the wait time the stall.
  void order_compute_after(uint64_t seq, Op op, DType dtype) override;

 private:
  struct InFlight {
    uint64_t seq = 0;
    OpArgs args;
    cudaEvent_t start = nullptr, end = nullptr;
    double t_issue = 0;  // now_seconds() at issue
  };
  // A compute stream's wait for an op: `before` marks where compute reached
  // the wait, `after` where the wait resolved.
  struct Stall {
    cudaEvent_t before = nullptr, after = nullptr;
    Op op = Op::kAllReduce;
    DType dtype = DType::kF32;
  };
  void retire();  // accounts and recycles the completed ops at the front, and the stalls
  ncclResult_t async_error();  // ncclCommGetAsyncError; ncclInProgress counts as success
  [[noreturn]] void fail_op(const std::string& what, ncclResult_t rc);
  cudaEvent_t take_event();
  void run_local(const Local& l);
  void run_quant(const Local& l);
  // The watcher thread: completes the mismatch checks, and (on a GPU) finds an
  // op on the GPU longer than the timeout, which means a peer never arrived
  // while the host may be blocked in a device sync that never returns: it
  // aborts the communicator and asks the watchdog which rank holds the op up.
  void run_watcher();
  void find_stuck_op(std::unique_lock<std::mutex>& flight_lock);

  // One op's mismatch check, posted by issue().
  struct Check {
    watchdog::Identity id{};
    int64_t step = 0;  // watchdog::step() at issue
    mismatch::Signature sig{};
    MPI_Request req = MPI_REQUEST_NULL;
  };
  void post_check(uint64_t seq, const OpArgs& args);
  // Completes the checks at the front, in order, as far as every rank has
  // posted them (waiting up to wait_s seconds for the rest), and ends the job
  // on one that failed. Returns whether any is left.
  bool settle_checks(double wait_s = 0);

  Group group_;
  cudaStream_t compute_ = nullptr;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  cudaEvent_t ready_ = nullptr;  // compute has reached the issue point
  std::deque<InFlight> in_flight_;  // changed under flight_mu_, read by the watcher under it
  std::mutex flight_mu_;
  std::condition_variable watch_cv_;
  bool stopping_ = false;
  int device_ = 0;
  std::thread watcher_;
  std::deque<Stall> stalls_;
  std::vector<cudaEvent_t> free_events_;
  uint64_t next_seq_ = 1;
  uint64_t done_seq_ = 0;
  Op last_op_ = Op::kAllReduce;  // of the op issued last, for error messages
  bool checking_ = false;        // the mismatch check is on (and the group has peers)
  MPI_Comm check_comm_ = MPI_COMM_NULL;   // the checks' all-reduces and nothing else
  MPI_Comm report_comm_ = MPI_COMM_NULL;  // a failed check's report
  std::mutex check_mu_;
  std::deque<Check> checks_;  // posted, not yet completed; a deque keeps their addresses
};

}  // namespace amsp::comm
