#include "comm/nccl/nccl_communicator.h"

#include <sched.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "core/error.h"
#include "core/mpi_check.h"
#include "gpu/check.h"
#include "kernels/cuda/ops.h"

namespace amsp::comm {
namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kI32: return ncclInt32;
    case DType::kF64: return ncclFloat64;
  }
  return ncclFloat32;
}

// ncclCommAbort has been seen to hang on a wedged peer; it gets a few seconds
// on a thread of its own, and the job ends whether or not it returned.
void abort_bounded(ncclComm_t comm) {
  if (!comm) return;
  auto returned = std::make_shared<std::atomic<bool>>(false);
  std::thread([comm, returned] {
    ncclCommAbort(comm);
    returned->store(true);
  }).detach();
  const double deadline = now_seconds() + 5.0;
  while (!returned->load() && now_seconds() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

// An all-to-all as NCCL composes it: one group of a send to and a receive
// from every rank, this one included (NCCL copies that block locally), on
// `stream`. Block p of `send` goes to rank p; block p of `recv` comes from it.
// Send and receive exist since NCCL 2.7; ncclAlltoAll only since 2.28.
ncclResult_t nccl_all_to_all(const void* send, void* recv, size_t count, DType dtype, int ranks,
                             ncclComm_t comm, cudaStream_t stream) {
  if (count == 0) return ncclSuccess;  // every rank issued the same count: nothing to match
  const size_t block = count * static_cast<size_t>(dtype_bytes(dtype));
  const ncclDataType_t type = nccl_type(dtype);
  ncclResult_t rc = ncclGroupStart();
  if (rc != ncclSuccess) return rc;
  for (int p = 0; p < ranks && rc == ncclSuccess; ++p) {
    rc = ncclSend(static_cast<const char*>(send) + p * block, count, type, p, comm, stream);
    if (rc == ncclSuccess)
      rc = ncclRecv(static_cast<char*>(recv) + p * block, count, type, p, comm, stream);
  }
  const ncclResult_t end = ncclGroupEnd();  // closes the group whatever happened in it
  return rc != ncclSuccess ? rc : end;
}

}  // namespace

NcclCommunicator::NcclCommunicator(Group group, cudaStream_t compute)
    : group_(std::move(group)), compute_(compute) {
  checking_ = mismatch::enabled_from_env() && group_.size() > 1;
  watch(group_);
  ncclUniqueId id;
  if (group_.rank() == 0) AMSP_NCCL_CHECK(ncclGetUniqueId(&id));
  AMSP_MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, group_.comm()));
  AMSP_NCCL_CHECK(ncclCommInitRank(&comm_, group_.size(), id, group_.rank()));
  AMSP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  AMSP_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  AMSP_CUDA_CHECK(cudaGetDevice(&device_));
  if (checking_) {
    AMSP_MPI_CHECK(MPI_Comm_dup(group_.comm(), &check_comm_));
    AMSP_MPI_CHECK(MPI_Comm_dup(group_.comm(), &report_comm_));
  }
  // The emulation runs each op to completion in issue(), so nothing is ever in
  // flight there; the watcher only completes the checks (the emulated NCCL's
  // own timeout, in issue, covers a peer that never arrives).
  if (checking_ || !AMSP_CUDA_EMULATION) watcher_ = std::thread([this] { run_watcher(); });
}

NcclCommunicator::~NcclCommunicator() {
  {
    std::lock_guard lock(flight_mu_);
    stopping_ = true;
  }
  watch_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
  synchronize();
  retire();
  // Every rank posted the same checks; they complete as soon as every rank
  // is here (a rank that never comes is the timeout's, as in synchronize).
  if (checking_ && !settle_checks(timeout() > 0 ? timeout() : 600))
    for (MPI_Comm* c : {&check_comm_, &report_comm_}) AMSP_MPI_CHECK(MPI_Comm_free(c));
  for (const Stall& st : stalls_)  // compute has not reached them yet: released when it does
    for (cudaEvent_t e : {st.before, st.after}) AMSP_CUDA_CHECK(cudaEventDestroy(e));
  for (cudaEvent_t e : free_events_) AMSP_CUDA_CHECK(cudaEventDestroy(e));
  if (ready_) AMSP_CUDA_CHECK(cudaEventDestroy(ready_));
  if (comm_) AMSP_NCCL_CHECK(ncclCommDestroy(comm_));
  if (stream_) AMSP_CUDA_CHECK(cudaStreamDestroy(stream_));
}

cudaEvent_t NcclCommunicator::take_event() {
  if (!free_events_.empty()) {
    cudaEvent_t e = free_events_.back();
    free_events_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  AMSP_CUDA_CHECK(cudaEventCreate(&e));  // with timing: in-flight time comes from it
  return e;
}

// The quantizing kinds of a Local, with the CUDA kernels (kernels/cuda/quant.cu).
void NcclCommunicator::run_quant(const Local& l) {
  namespace kc = kernels::cuda;
  const bool s16 = l.src_dtype == DType::kBF16, d16 = l.dst_dtype == DType::kBF16;
  const auto* words = static_cast<const int32_t*>(l.src);
  switch (l.kind) {
    case Local::kQuantize:
      if (s16) kc::quantize(static_cast<const kc::bf16*>(l.src), l.count, l.records, l.spec,
                            static_cast<int32_t*>(l.dst), stream_);
      else kc::quantize(static_cast<const float*>(l.src), l.count, l.records, l.spec,
                        static_cast<int32_t*>(l.dst), stream_);
      break;
    case Local::kDequantize:
      if (d16) kc::dequantize(words, l.count, l.records, l.spec, static_cast<kc::bf16*>(l.dst), stream_);
      else kc::dequantize(words, l.count, l.records, l.spec, static_cast<float*>(l.dst), stream_);
      break;
    case Local::kDequantizeSum:
      if (d16) kc::dequantize_sum(words, l.count, l.records, l.spec, static_cast<kc::bf16*>(l.dst), stream_);
      else kc::dequantize_sum(words, l.count, l.records, l.spec, static_cast<float*>(l.dst), stream_);
      break;
    default: break;
  }
}

// A Local on this communicator's stream, with its accesses recorded for the
// emulation's happens-before checker.
void NcclCommunicator::run_local(const Local& l) {
  if (l.kind == Local::kNone || l.count == 0) return;
  namespace kc = kernels::cuda;
  using bf = uint16_t;
  const bool s16 = l.src_dtype == DType::kBF16, d16 = l.dst_dtype == DType::kBF16;
  AMSP_HB_ACCESS(stream_, l.src, static_cast<size_t>(l.src_bytes()), false);
  AMSP_HB_ACCESS(stream_, l.dst, static_cast<size_t>(l.dst_bytes()), true);
  if (l.quantizing()) {
    run_quant(l);
    return;
  }
  const auto* sf = static_cast<const float*>(l.src);
  const auto* sb = static_cast<const bf*>(l.src);
  auto* df = static_cast<float*>(l.dst);
  auto* db = static_cast<bf*>(l.dst);
  if (l.kind == Local::kAdd) {
    if (!d16) s16 ? kc::add(df, sb, l.count, stream_) : kc::add(df, sf, l.count, stream_);
    else s16 ? kc::add(db, sb, l.count, stream_) : kc::add(db, sf, l.count, stream_);
  } else if (s16 == d16) {
    AMSP_CUDA_CHECK(cudaMemcpyAsync(l.dst, l.src, static_cast<size_t>(l.count * dtype_bytes(l.dst_dtype)),
                                    cudaMemcpyDeviceToDevice, stream_));
  } else if (d16) {
    kc::to_bf16(sf, db, l.count, stream_);
  } else {
    kc::to_f32(sb, df, l.count, stream_);
  }
}

uint64_t NcclCommunicator::issue(const OpArgs& a) {
  // Order after the compute issued so far, on the GPU; a chained op also
  // after its predecessor on another communicator's stream, on the GPU too.
  AMSP_CUDA_CHECK(cudaEventRecord(ready_, compute_));
  AMSP_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
  if (a.after.sequence() != 0) {
    auto* before = dynamic_cast<NcclCommunicator*>(a.after.communicator());
    if (!before) abort_job(cat(op_name(a.op), " on group ", name(), ": chained after an op of a non-NCCL communicator"));
    before->stream_wait(a.after, stream_);
  }
  run_local(a.before);
  InFlight f{next_seq_++, a, take_event(), take_event(), now_seconds()};
  post_check(f.seq, a);  // before the op: the emulation may hang in it, as NCCL would
  last_op_ = a.op;
  AMSP_CUDA_CHECK(cudaEventRecord(f.start, stream_));
  const size_t n = static_cast<size_t>(a.count);
  // bf16 sums are NCCL's own (its reduction order and rounding, not the MPI
  // backend's rank-order fp32 sum).
  const ncclDataType_t type = nccl_type(a.dtype);
  ncclResult_t rc = ncclSuccess;
#if AMSP_CUDA_EMULATION
  // The emulation runs the op here, in MPI: a peer that never arrives makes it
  // return ncclRemoteError after the timeout. Meanwhile this rank waits in it.
  amsp::emu::nccl_set_timeout(timeout());
  const watchdog::Waiting waiting(watched(), a.op, f.seq);
#endif
  switch (a.op) {
    case Op::kAllGather:  // in place when send == recv + rank * count, as NCCL defines
      rc = ncclAllGather(a.send, a.recv, n, type, comm_, stream_);
      break;
    case Op::kReduceScatter:
      rc = ncclReduceScatter(a.send, a.recv, n, type, ncclSum, comm_, stream_);
      break;
    case Op::kAllReduce:
      rc = ncclAllReduce(a.recv, a.recv, n, type, ncclSum, comm_, stream_);
      break;
    case Op::kBroadcast:
      rc = ncclBroadcast(a.recv, a.recv, n, type, a.root, comm_, stream_);
      break;
    case Op::kAllToAll:
      rc = nccl_all_to_all(a.send, a.recv, n, a.dtype, size(), comm_, stream_);
      break;
  }
  if (rc == ncclRemoteError) {  // a peer failed or, emulated, never arrived: ask which
    abort_bounded(comm_);
    comm_ = nullptr;
    timed_out(f.seq, a);
  }
  if (rc != ncclSuccess && rc != ncclInProgress) fail_op(cat("issuing ", op_name(a.op), " #", f.seq), rc);
  run_local(a.then);
  run_local(a.and_then);
  AMSP_CUDA_CHECK(cudaEventRecord(f.end, stream_));
  std::lock_guard lock(flight_mu_);
  in_flight_.push_back(f);
  return f.seq;
}

void NcclCommunicator::order_compute_after(uint64_t seq, Op op, DType dtype) {
  if (done_seq_ >= seq) return;
  for (const InFlight& f : in_flight_) {
    if (f.seq != seq) continue;
    Stall s{take_event(), take_event(), op, dtype};
    AMSP_CUDA_CHECK(cudaEventRecord(s.before, compute_));
    AMSP_CUDA_CHECK(cudaStreamWaitEvent(compute_, f.end, 0));
    AMSP_CUDA_CHECK(cudaEventRecord(s.after, compute_));
    stalls_.push_back(s);
    return;
  }
}

void NcclCommunicator::retire() {
  // Stalls whose end the compute stream passed: the time it waited.
  while (!stalls_.empty()) {
    const Stall& s = stalls_.front();
    const cudaError_t rc = cudaEventQuery(s.after);
    if (rc == cudaErrorNotReady) break;
    AMSP_CUDA_CHECK(rc);
    float ms = 0;
    AMSP_CUDA_CHECK(cudaEventElapsedTime(&ms, s.before, s.after));
    record_exposed(s.op, s.dtype, ms * 1e-3);
    free_events_.push_back(s.before);
    free_events_.push_back(s.after);
    stalls_.pop_front();
  }
  while (!in_flight_.empty()) {
    InFlight& f = in_flight_.front();
    const cudaError_t rc = cudaEventQuery(f.end);
    if (rc == cudaErrorNotReady) return;
    AMSP_CUDA_CHECK(rc);
    // In flight on the GPU: from the moment the op could start (after the
    // compute it waited for) to its end.
    float ms = 0;
    AMSP_CUDA_CHECK(cudaEventElapsedTime(&ms, f.start, f.end));
    record_completion(f.seq, f.args.op, f.args.dtype, ms * 1e-3);
    free_events_.push_back(f.start);
    free_events_.push_back(f.end);
    done_seq_ = f.seq;
    std::lock_guard lock(flight_mu_);
    in_flight_.pop_front();
  }
  // An op can complete and still have failed (a peer's error); say so now
  // rather than when something later waits. The error belongs to the
  // communicator, not to one op: name the ops issued so far.
  if (const ncclResult_t e = async_error(); e != ncclSuccess)
    fail_op(cat("(ops issued up to ", op_name(last_op_), " #", next_seq_ - 1, ")"), e);
}

ncclResult_t NcclCommunicator::async_error() {
  ncclResult_t async = ncclSuccess;
  AMSP_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
  return async == ncclInProgress ? ncclSuccess : async;
}

// Aborts the communicator (so that no peer waits on it) and the job, naming
// rank (abort_job does), group and op.
void NcclCommunicator::fail_op(const std::string& what, ncclResult_t rc) {
  abort_bounded(comm_);
  comm_ = nullptr;
  abort_job(cat("NCCL error on group ", name(), " ", what, ": ", ncclGetErrorString(rc)));
}

bool NcclCommunicator::done(uint64_t seq) {
  if (done_seq_ < seq) retire();
  return done_seq_ >= seq;
}

void NcclCommunicator::block_until(uint64_t seq, double deadline) {
  // Poll rather than cudaEventSynchronize, so that an NCCL error or a peer that
  // never arrives ends the job instead of hanging it.
  while (!done(seq)) {
    if (const ncclResult_t e = async_error(); e != ncclSuccess)
      fail_op(cat("waiting for ", op_name(in_flight_.front().args.op), " #", in_flight_.front().seq), e);
    if (deadline > 0 && now_seconds() > deadline) {
      settle_checks();  // a check that failed names the cause better than the hang
      OpArgs stuck;
      for (const InFlight& f : in_flight_)
        if (f.seq == seq) stuck = f.args;
      // Abort first: a peer that never arrives would hang the destructor's
      // ncclCommDestroy, and the job is ending anyway. Then the watchdog asks
      // the group's ranks, over MPI, which one holds the op up.
      abort_bounded(comm_);
      comm_ = nullptr;
      timed_out(seq, stuck);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void NcclCommunicator::run_watcher() {
  const bool device = !AMSP_CUDA_EMULATION && cudaSetDevice(device_) == cudaSuccess;
  bool checks_left = false;
  for (;;) {
    {
      std::unique_lock lock(flight_mu_);
      // Checks complete only while someone tests them: often while any is left.
      watch_cv_.wait_for(lock, std::chrono::milliseconds(checks_left ? 2 : 250));
      if (stopping_) return;
      if (device) find_stuck_op(lock);
    }
    if (checking_) checks_left = settle_checks();
  }
}

void NcclCommunicator::find_stuck_op(std::unique_lock<std::mutex>& flight_lock) {
  const double limit = timeout();
  if (limit <= 0) return;
  for (const InFlight& f : in_flight_) {
    if (now_seconds() - f.t_issue <= limit) return;            // the ops after it are younger
    if (cudaEventQuery(f.end) != cudaErrorNotReady) continue;  // done, not yet retired
    const InFlight stuck = f;
    flight_lock.unlock();
    if (checking_) settle_checks();  // a check that failed names the cause better than the hang
    abort_bounded(comm_);
    watchdog::hang(watched(), stuck.args.op, stuck.seq, now_seconds() - stuck.t_issue);
  }
}

void NcclCommunicator::post_check(uint64_t seq, const OpArgs& a) {
  if (!checking_) return;
  std::lock_guard lock(check_mu_);
  Check& c = checks_.emplace_back();
  c.id = identity_of(seq, a);
  c.step = watchdog::step();
  c.sig = mismatch::signature(c.id);
  AMSP_MPI_CHECK(
      MPI_Iallreduce(MPI_IN_PLACE, c.sig.data(), 2, MPI_UINT64_T, MPI_MAX, check_comm_, &c.req));
}

bool NcclCommunicator::settle_checks(double wait_s) {
  const double deadline = now_seconds() + wait_s;
  // Held while a failed check is reported, so that no other thread of this
  // rank joins the report's collective a second time.
  std::unique_lock lock(check_mu_);
  while (!checks_.empty()) {
    Check& c = checks_.front();
    int done = 0;
    AMSP_MPI_CHECK(MPI_Test(&c.req, &done, MPI_STATUS_IGNORE));
    if (!done) {
      if (now_seconds() >= deadline) return true;
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      lock.lock();
      continue;
    }
    if (!mismatch::agreed(c.sig, c.id))
      mismatch::report(watched(), rank(), report_comm_, c.id, c.step,
                       "; found beside the op: NCCL may have moved data");
    checks_.pop_front();
  }
  return false;
}

void NcclCommunicator::stream_wait(const Handle& h, cudaStream_t stream) {
  if (h.sequence() == 0 || done_seq_ >= h.sequence()) return;
  for (const InFlight& f : in_flight_) {
    if (f.seq == h.sequence()) {
      AMSP_CUDA_CHECK(cudaStreamWaitEvent(stream, f.end, 0));
      return;
    }
  }
}

}  // namespace amsp::comm
