// The NCCL backend of the communicator interface (comm/communicator.h), in
// every build: against real NCCL with -DAMSP_CUDA=ON, against the emulation
// of NCCL over MPI (kernels/cuda/api.h) otherwise, so that the CUDA backend's
// tests run it on the CPU. Buffers are device memory, of the op's dtype
// (ncclFloat32, ncclBfloat16, ncclInt32). Each communicator has
// its own CUDA stream: an op first waits (on the GPU) for everything issued so
// far on the compute stream, so it sees the gradients compute just wrote, and
// the stream keeps ops in issue order. Handle::wait blocks the host until the
// op's completion event; stream_wait makes a compute stream wait on the GPU
// instead, which is how the engine should consume an all-gathered unit.
//
// Errors. An NCCL error, returned when an op is issued or reported by
// ncclCommGetAsyncError when an op completes or while the host waits, and a
// wait past the timeout, abort the NCCL communicator (ncclCommAbort, so that
// no peer stays blocked on it) and end the job with one line naming the rank,
// the group and the op.
#pragma once

#include "kernels/cuda/api.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/group.h"

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
  // The watcher thread (real CUDA only): an op on the GPU longer than the
  // timeout means a peer never arrived, and the host may be blocked in a
  // device sync that never returns; the watcher aborts the communicator and
  // asks the watchdog which rank holds the op up.
  void watch_in_flight();

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
};

}  // namespace amsp::comm
