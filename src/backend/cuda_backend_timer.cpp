// The kernel profile's timer on the CUDA backend. A call only enqueues, so the
// host's clock around it says nothing about the device: instead a timing event
// is recorded on the compute stream before and after the call's work, and the
// stretch is the device's time between them. When the device runs behind the
// host, that is the call's own work; when it waits for the host to enqueue,
// the wait is charged to the call it waited for, as in any event-based profile.
//
// Events come from a pool and are reused. Their times are read
// (cudaEventElapsedTime) only once the device has passed them: at take(),
// which waits for the last one, and whenever kMaxPending pairs are
// outstanding. The last resolved end event is kept until the next resolve,
// so that the idle time before the first pair of a batch is read too. Only a
// run with --kernel-profile makes a timer; nothing here runs otherwise.
#include <utility>

#include "backend/cuda_backend.h"
#include "backend/stream_timer.h"
#include "gpu/check.h"

namespace amsp::backend {

namespace {

class CudaStreamTimer final : public StreamTimer {
 public:
  explicit CudaStreamTimer(cudaStream_t stream) : stream_(stream) {}
  ~CudaStreamTimer() override {
    for (const Pending& p : pending_) free_.insert(free_.end(), {p.start, p.end});
    if (open_) free_.push_back(open_);
    if (last_end_) free_.push_back(last_end_);
    for (cudaEvent_t e : free_) AMSP_CUDA_CHECK(cudaEventDestroy(e));
  }
  CudaStreamTimer(const CudaStreamTimer&) = delete;
  CudaStreamTimer& operator=(const CudaStreamTimer&) = delete;

  void start() override {
    if (!open_) open_ = take_event();
    AMSP_CUDA_CHECK(cudaEventRecord(open_, stream_));
  }

  void stop(int slot) override {
    cudaEvent_t end = take_event();
    AMSP_CUDA_CHECK(cudaEventRecord(end, stream_));
    pending_.push_back({slot, std::exchange(open_, nullptr), end});
    if (pending_.size() >= kMaxPending) resolve();
  }

  std::vector<Stretch> take() override {
    resolve();
    if (last_end_)
      free_.push_back(std::exchange(last_end_, nullptr));  // the next chain starts afresh
    return std::exchange(done_, {});
  }

 private:
  // Enough for a step of a large model between reads (a llama-1b micro-batch
  // makes about 900 calls); each read waits for the device.
  static constexpr size_t kMaxPending = 4096;

  struct Pending {
    int slot;
    cudaEvent_t start, end;
  };

  cudaEvent_t take_event() {
    if (free_.empty()) {
      cudaEvent_t e = nullptr;
      AMSP_CUDA_CHECK(cudaEventCreate(&e));  // timing enabled
      return e;
    }
    cudaEvent_t e = free_.back();
    free_.pop_back();
    return e;
  }

  // The stream is in order: once the last end event is complete, all are.
  void resolve() {
    if (pending_.empty()) return;
    AMSP_CUDA_CHECK(cudaEventSynchronize(pending_.back().end));
    for (const Pending& p : pending_) {
      Stretch s{p.slot, elapsed_ms(p.start, p.end)};
      if (last_end_) {
        s.idle_ms = elapsed_ms(last_end_, p.start);
        free_.push_back(last_end_);
      }
      done_.push_back(s);
      free_.push_back(p.start);
      last_end_ = p.end;
    }
    pending_.clear();
  }

  static double elapsed_ms(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0;
    AMSP_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    return ms;
  }

  cudaStream_t stream_;
  cudaEvent_t open_ = nullptr;      // recorded by start(), not yet stopped
  cudaEvent_t last_end_ = nullptr;  // the last resolved stretch's end, since the last take
  std::vector<Pending> pending_;
  std::vector<Stretch> done_;
  std::vector<cudaEvent_t> free_;
};

}  // namespace

std::unique_ptr<StreamTimer> CudaBackend::make_stream_timer() {
  return std::make_unique<CudaStreamTimer>(stream_);
}

}  // namespace amsp::backend
