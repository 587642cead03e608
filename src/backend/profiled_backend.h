// A backend that times every call of another, by name: the kernel profile of
// `amsp train --kernel-profile` (engine/kernel_profile.h). It wraps the run's
// backend only when profiling, so a run without the option runs exactly the
// code it ran before, with no timing events, synchronisation or branches added.
//
// What is timed: every call that does work on the compute stream (the model's
// kernels, the optimizer, copy, add, fill_zero, sum_squares, alloc's zeroing,
// the host transfers, quantization), through the wrapped backend's StreamTimer (wall time on
// the CPU, an event pair on the CUDA compute stream). Not timed: ordering
// (record, wait, synchronize) and questions (memory, describe, peak_flops).
// Calls the wrapped backend makes to itself are inside the call that made them.
//
// Names: the Backend method's name, and for some a detail in brackets, so that
// calls of one shape add up apart from others: the linear kernels
// "linear_forward[M=4096,in=2048,out=5632]" (M rows, the weight's in and out),
// a dtype conversion "copy[fp32->bf16]". The part before '[' is the op.
//
// Timing is off until set_timing(true): the engine's set-up, evaluations and
// checkpoints are not part of the profile.
//
// Between two timed calls, the time nothing timed ran (the timer's idle_ms:
// the device's between its events, the host's on the CPU) is kept by the pair
// of names around it (idle()): where a device sat waiting for its host to
// enqueue, or for another stream, and after and before what.
//
// Timed or counted, every name also sums the least device memory its calls
// could have moved: each operand of the call read once and each result written
// once (an accumulated one read and written), at the dtypes and extents the call
// was given; over the time, a kernel's effective bandwidth (the kernel
// profile's GB/s). Counting (set_counting(true)), where the wrapped backend's
// device counts (Backend::device_counts: the CUDA emulation): per name, what the
// calls asked of the device (stream operations, host synchronisations, bytes
// read and written, FLOPs by unit). The roofline benchmark
// (benchmarks/roofline_bench.cpp) reads both.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/stream_timer.h"

namespace amsp::backend {

// One name's calls over some stretch of a run.
struct KernelTime {
  std::string name;  // "linear_forward[M=..,in=..,out=..]", "attention_forward", ...
  std::string op;    // the Backend method: name up to '['
  int64_t calls = 0;
  double ms = 0;     // summed (0 unless timing)
  // Summed, while counting (ProfiledBackend::set_counting); `counted` says
  // whether the device counted anything.
  bool counted = false;
  int64_t launches = 0, host_syncs = 0;
  int64_t bytes = 0;      // device memory read and written
  int64_t min_bytes = 0;  // operands read once, results written once (timing or counting)
  double tensor_flops = 0, simt_flops = 0;
};

// The time nothing timed ran between two consecutive timed calls, by the pair
// of names: on a device, the time its stream sat empty (waiting for the host
// to enqueue, or for another stream) after a call of `after` and before one of
// `before`; on the CPU, the host's own work between the two calls.
struct IdleTime {
  std::string after, before;
  int64_t gaps = 0;
  double ms = 0;      // summed
  double max_ms = 0;  // the longest one

  // Adds the gaps of the same pair from another stretch of the run.
  void add(const IdleTime& other) {
    gaps += other.gaps;
    ms += other.ms;
    max_ms = std::max(max_ms, other.max_ms);
  }
};

class ProfiledBackend final : public Backend {
 public:
  explicit ProfiledBackend(std::unique_ptr<Backend> inner);

  // Calls are timed while on.
  void set_timing(bool on) { timing_ = on; }
  // Calls are counted while on.
  void set_counting(bool on) { counting_ = on; }
  // The calls timed since the last take, one entry per name that had any
  // (first-call order); waits for the device to finish them.
  std::vector<KernelTime> take();
  // The idle time between the calls the last take() returned, by pair of names
  // (in the order of each pair's first gap). The first call after a take has no
  // gap before it: a take ends a chain.
  const std::vector<IdleTime>& idle() const { return idle_; }

  Device device() const override { return inner_->device(); }
  std::string describe() const override { return inner_->describe(); }
  std::unique_ptr<StreamTimer> make_stream_timer() override { return inner_->make_stream_timer(); }

  Buffer alloc(DType dtype, int64_t count) override;
  MemoryStats memory() const override { return inner_->memory(); }
  int64_t device_memory_free() const override { return inner_->device_memory_free(); }
  int64_t host_syncs() const override { return inner_->host_syncs(); }
  void profiler_capture(bool on) override { inner_->profiler_capture(on); }
  DeviceCounts device_counts() const override { return inner_->device_counts(); }
  void reserve(int64_t predicted_peak) override { inner_->reserve(predicted_peak); }
  Buffer alloc_host(int64_t count) override { return inner_->alloc_host(count); }
  void to_host(const View& src, float* dst) override;
  void to_host(const View& src, int32_t* dst) override;
  void from_host(const float* src, const View& dst) override;
  void from_host(const int32_t* src, const View& dst) override;

  Event record() override { return inner_->record(); }
  void wait(const Event& event) override { inner_->wait(event); }
  void synchronize() override { inner_->synchronize(); }

  std::unique_ptr<comm::Communicator> make_communicator(comm::Group group) override {
    return inner_->make_communicator(std::move(group));
  }

  void fill_zero(const View& x) override;
  void copy(const View& src, const View& dst) override;
  void add(const View& dst, const View& src) override;
  double sum_squares(const View& x) override;

  void quantize(const View& src, int64_t n, int64_t records, const View& dst,
                const kernels::quant::Spec& spec) override;
  void dequantize(const View& src, int64_t n, int64_t records, const View& dst,
                  const kernels::quant::Spec& spec) override;
  void dequantize_sum(const View& src, int64_t n, int64_t records, const View& dst,
                      const kernels::quant::Spec& spec) override;

  void embedding_forward(const View& tokens, const View& table, const View& out, int64_t rows,
                         int64_t dim) override;
  void embedding_backward(const View& tokens, const View& dout, const View& dtable, int64_t rows,
                          int64_t dim) override;

  void linear_forward(const View& x, const View& w, const View& y, int64_t M, int64_t in,
                      int64_t out, float beta) override;
  void linear_forward_residual(const View& x, const View& w, const View& r, const View& y,
                               int64_t M, int64_t in, int64_t out) override;
  void linear_backward_input(const View& dy, const View& w, const View& dx, int64_t M, int64_t in,
                             int64_t out, float beta) override;
  void linear_backward_weight(const View& dy, const View& x, const View& dw, int64_t M, int64_t in,
                              int64_t out, float beta) override;

  void rmsnorm_forward(const View& x, const View& w, const View& y, const View& inv_rms,
                       int64_t rows, int64_t dim, float eps) override;
  void rmsnorm_apply(const View& x, const View& w, const View& inv_rms, const View& y, int64_t rows,
                     int64_t dim) override;
  void rmsnorm_backward(const View& dy, const View& x, const View& w, const View& inv_rms,
                        const View& dx, const View& dw, int64_t rows, int64_t dim,
                        const View& dx_bf16, float dw_beta) override;

  void rope_table(const View& cos, const View& sin, int64_t max_T, int64_t head_dim,
                  double theta) override;
  void rope_forward(const View& x, const View& cos, const View& sin, int64_t B, int64_t T,
                    int64_t heads, int64_t head_dim, int64_t row_stride) override;
  void rope_backward(const View& dx, const View& cos, const View& sin, int64_t B, int64_t T,
                     int64_t heads, int64_t head_dim, int64_t row_stride) override;

  int64_t attention_saved_count(int64_t B, int64_t T, int64_t H) const override {
    return inner_->attention_saved_count(B, T, H);
  }
  void attention_forward(const View& qkv, const View& saved, const View& out, int64_t B, int64_t T,
                         int64_t H, int64_t KV, int64_t D) override;
  void attention_backward(const View& qkv, const RopeTables& rope, const View& saved,
                          const View& out, const View& dout, const View& dqkv, int64_t B, int64_t T,
                          int64_t H, int64_t KV, int64_t D) override;

  void swiglu_forward(const View& gate_up, const View& out, int64_t rows, int64_t I) override;
  void swiglu_backward(const View& gate_up, const View& dout, const View& dgate_up, int64_t rows,
                       int64_t I) override;

  LossSum cross_entropy_forward(const View& logits, const View& targets, const View& lse,
                                int64_t rows, int64_t V) override;
  void from_host_async(const int32_t* src, const View& dst) override;
  void to_host_f64(const View& src, double* dst) override;
  // Not timed: the copies run beside compute (a device) or are a checkpoint's (the CPU).
  void begin_snapshot(const std::vector<HostCopy>& copies) override { inner_->begin_snapshot(copies); }
  void fence_snapshot() override { inner_->fence_snapshot(); }
  void wait_snapshot() override { inner_->wait_snapshot(); }
  void cross_entropy_forward_into(const View& logits, const View& targets, const View& lse, int64_t rows,
                                  int64_t V, const View& acc) override;
  void sum_squares_into(const View& x, const View& acc) override;
  void clip_scale(const View& sumsq, double divisor, double max_norm, const View& scale) override;
  void cross_entropy_backward(const View& logits, const View& targets, const View& lse,
                              int64_t rows, int64_t V, float scale) override;

  void adamw(const View& master, const View& m, const View& v, const View& grad,
             const View& param_copy, const AdamWStep& step) override;
  void adamw_parts(const std::vector<AdamWPart>& parts, const AdamWStep& step) override;

  double peak_flops() override { return inner_->peak_flops(); }

 private:
  // Runs `call`, timed and counted under the name `make_name()` returns (built
  // only while timing or counting), or under `name`; `min_bytes` is the call's
  // least device traffic (see the top).
  template <typename MakeName, typename Call>
  auto timed_as(const MakeName& make_name, int64_t min_bytes, const Call& call);
  template <typename Call>
  auto timed(const char* name, int64_t min_bytes, const Call& call);
  int slot(const std::string& name);
  // The idle time between consecutive stretches, by the pair of names around it.
  std::vector<IdleTime> idle_by_pair(const std::vector<StreamTimer::Stretch>& stretches) const;
  // Adds what the device counted since `before` to slot s.
  void count(int s, const DeviceCounts& before);

  // Declared before timer_: the timer's events belong to the inner backend's
  // stream and go first.
  std::unique_ptr<Backend> inner_;
  std::unique_ptr<StreamTimer> timer_;
  bool timing_ = false, counting_ = false;
  std::map<std::string, int> slots_;
  std::vector<std::string> names_;  // by slot
  std::vector<KernelTime> counts_;  // by slot: calls and, while counting, counts
  std::vector<IdleTime> idle_;      // the last take's
};

}  // namespace amsp::backend
