// The CUDA backend: backend/backend.h on kernels/cuda/ops.h and cuBLAS, with
// NCCL communicators. The same code runs on a GPU (-DAMSP_CUDA=ON) and, in
// every other build, on the CPU emulation of CUDA, cuBLAS and NCCL
// (kernels/cuda/api.h), which is how the tests run it.
//
// Semantics are the CPU backend's (cpu_backend.h), to the bit where the
// arithmetic allows:
//   - Matrix products are cuBLASLt's (cuda_gemm.h: an algorithm per shape,
//     chosen once, and a workspace made with the backend).
//   - compute() == kF32: fp32 operands (bf16 weights widened first into
//     scratch), CUBLAS_COMPUTE_32F, beta applied by cuBLASLt. TF32 is not enabled.
//   - compute() == kBF16: both operands rounded to bf16 into scratch (to_bf16;
//     bf16 weights and activations are used as they are), bf16 x bf16 with
//     fp32 accumulation, beta * y added in fp32 by the GEMM's
//     epilogue, and the result stored once in y's dtype (fp32, or rounded to
//     bf16):
//         y  = store(round(x) round(W)^T + beta * y)
//         dx = store(round(dy) round(W) + beta * dx)
//         dw = store(dw + round(dy)^T round(x))
//     cuBLAS sums in another order than OpenBLAS: products agree within fp32
//     roundoff, so a bf16 output may land on the other side of a rounding
//     boundary now and then.
//   - The other kernels are kernels/cuda, which share the per-element
//     arithmetic of kernels/common/math.h with the CPU kernels. Attention is
//     fused: attention_saved_count is B * H * T (a log-sum-exp per row and
//     head), and attention_backward reads `out`. With compute() == kBF16 it
//     runs on tensor cores (head dims that are multiples of 16 up to 128),
//     rounding its inputs to bf16 as the CPU backend does and its
//     probabilities as the CPU backend does not: within the bound of
//     doc/engine-tests.md, not to the bit.
//
// Ordering. One compute stream (non-blocking); every call enqueues and
// returns, except those that bring a result to the host: to_host, to_host_f64,
// from_host (which waits for its pinned staging buffer to be consumed),
// sum_squares and cross_entropy_forward. record() records a cudaEvent, wait()
// synchronises the host with it, synchronize() with the stream.
//
// Memory. alloc() takes blocks from a caching allocator (caching_allocator.h)
// and zeroes them on the compute stream; memory() reports its counters
// (in_use, peak and reserved, in the allocator's rounded sizes). Scratch for
// conversions and kernel workspaces comes from the same allocator and is
// released when the call has enqueued its work (stream order makes that
// safe). Buffers keep the allocator alive, so they may outlive the backend.
//
// Checks. Every call checks dtypes, devices and sizes as the CPU backend
// does; a host view handed to a kernel is an Error. Two checks need values
// that live on the device:
//   - token ids: the embedding kernels do not read them back; the model
//     checks them on the host before uploading (Llama::set_batch), so a bad
//     id is an Error before any kernel runs.
//   - targets >= V: cross_entropy_forward reports the first such row when its
//     loss comes back to the host (Error naming row, target and vocabulary);
//     cross_entropy_backward relies on the forward having done so.
//
// Happens-before. Every kernel's access to device memory is declared with
// AMSP_HB_ACCESS, so that the emulation's checker sees each kernel's reads
// and writes (kernels/cuda/api.h); copies, sets and cuBLAS calls declare their
// own in the emulated runtime and cuBLAS. Once each, so that the emulation's
// byte counts (the roofline benchmark's) count each access once.
//
// A CudaBackend is one compute stream: call it from one thread at a time.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/caching_allocator.h"
#include "backend/cuda_gemm.h"
#include "kernels/cuda/api.h"

namespace amsp::backend {

class CudaBackend final : public Backend {
 public:
  // Makes `device` current (cudaSetDevice) and creates the stream and the
  // cuBLAS handle. compute: kF32 or kBF16, else Error.
  CudaBackend(DType compute, int device);
  ~CudaBackend() override;

  Device device() const override { return Device::kCuda; }
  // "cuda:0 (NVIDIA H100 80GB HBM3, sm_90)", and the attention's warp layout where it is not
  // the default (AMSP_ATTENTION_WARP_TILES=2).
  std::string describe() const override;
  int device_index() const { return device_; }
  const std::string& device_name() const { return name_; }
  cudaStream_t stream() const { return stream_; }

  Buffer alloc(DType dtype, int64_t count) override;
  Buffer alloc_host(int64_t count) override;
  MemoryStats memory() const override;
  int64_t device_memory_free() const override;
  int64_t host_syncs() const override { return host_syncs_; }
  void profiler_capture(bool on) override;
  DeviceCounts device_counts() const override;
  void reserve(int64_t predicted_peak) override;
  void to_host(const View& src, float* dst) override;
  void to_host(const View& src, int32_t* dst) override;
  void from_host(const float* src, const View& dst) override;
  void from_host(const int32_t* src, const View& dst) override;

  Event record() override;
  void wait(const Event& event) override;
  void synchronize() override;
  // A pair of timing events on the compute stream around each call
  // (cuda_backend_timer.cpp).
  std::unique_ptr<StreamTimer> make_stream_timer() override;

  std::unique_ptr<comm::Communicator> make_communicator(comm::Group group) override;

  void fill_zero(const View& x) override;
  void copy(const View& src, const View& dst) override;
  void add(const View& dst, const View& src) override;
  double sum_squares(const View& x) override;

  // cuda_backend_quant.cpp
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

  int64_t attention_saved_count(int64_t B, int64_t T, int64_t H) const override;
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
  // The snapshot's copies run on copy_stream_, behind an event of the compute
  // stream; fence_snapshot makes the compute stream wait for snap_done_ once;
  // wait_snapshot synchronises the calling thread with snap_done_.
  void begin_snapshot(const std::vector<HostCopy>& copies) override;
  void fence_snapshot() override;
  void wait_snapshot() override;
  void cross_entropy_forward_into(const View& logits, const View& targets, const View& lse, int64_t rows,
                                  int64_t V, const View& acc) override;
  void sum_squares_into(const View& x, const View& acc) override;
  void clip_scale(const View& sumsq, double divisor, double max_norm, const View& scale) override;
  void cross_entropy_backward(const View& logits, const View& targets, const View& lse,
                              int64_t rows, int64_t V, float scale) override;

  void adamw(const View& master, const View& m, const View& v, const View& grad,
             const View& param_copy, const AdamWStep& step) override;
  void adamw_parts(const std::vector<AdamWPart>& parts, const AdamWStep& step) override;

  // The bf16 dense tensor-core peak of this device from a table by name
  // (cuda_peaks.cpp); 0 for a device the table does not know. On the
  // emulated device: the CPU's measured sgemm peak, since that is what runs
  // the emulation's matrix products.
  double peak_flops() override;

 private:
  void sync_host();  // the host waits for the compute stream, counted
  int64_t host_syncs_ = 0;
  // Device memory released back to the allocator when it goes out of scope.
  class Scratch {
   public:
    Scratch(CachingAllocator& a, int64_t bytes) : a_(a), p_(bytes > 0 ? a.allocate(bytes) : nullptr) {}
    ~Scratch() {
      if (p_) a_.release(p_);
    }
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    template <typename T>
    T* as() const { return static_cast<T*>(p_); }

   private:
    CachingAllocator& a_;
    void* p_;
  };
  Scratch scratch(int64_t bytes) { return Scratch(*allocator_, bytes); }

  // The happens-before declarations of the work about to be enqueued (nothing
  // in a real CUDA build). They name the caller's file and line, so that a
  // violation points at the kernel call rather than at these helpers.
  void reads(const void* p, int64_t bytes, const char* file = __builtin_FILE(),
             int line = __builtin_LINE());
  void writes(const void* p, int64_t bytes, const char* file = __builtin_FILE(),
              int line = __builtin_LINE());
  void reads(const View& v, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    reads(v.data, v.bytes(), file, line);
  }
  void writes(const View& v, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    writes(v.data, v.bytes(), file, line);
  }
  // The same for a gather or scatter that touches at most `traffic` bytes of v,
  // which rows depending on data: the whole of v is ordered, `traffic` counted.
  void reads_rows(const View& v, int64_t traffic, const char* file = __builtin_FILE(),
                  int line = __builtin_LINE());
  void writes_rows(const View& v, int64_t traffic, const char* file = __builtin_FILE(),
                   int line = __builtin_LINE());
  // The rows [0, T) of attention's rope tables (none when they are empty).
  void reads_rope(const RopeTables& rope, int64_t T, int64_t D, const char* file = __builtin_FILE(),
                  int line = __builtin_LINE());
  // Pinned host memory of at least `bytes`, reused by every transfer.
  void* staging(int64_t bytes);
  // Device -> pinned staging, then waits for the stream. Returns the staging.
  const void* download(const void* src, int64_t bytes);
  // An operand of a matrix product in the dtype the product takes: the view's
  // own memory if it has that dtype, else a converted copy in `s`.
  const float* as_f32(const View& v, Scratch& s);
  const uint16_t* as_bf16(const View& v, Scratch& s);
  // C_in: where beta's term is read, C itself unless given (a matrix of C's
  // layout and dtype, disjoint from it: cuBLASLt's C, with C its D).
  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* A, bool a_bf16,
            int64_t lda, const void* B, bool b_bf16, int64_t ldb, float beta, void* C, bool c_bf16,
            int64_t ldc, const void* C_in = nullptr);
  // y[M, n] = a[M, k] op(w) + beta y, op(w) = w^T for w[n, k] (w_transposed,
  // linear_forward) or w for w[k, n] (linear_backward_input); beta's y read
  // from y_in instead where given.
  void linear_product(const View& a, const View& w, const View& y, int64_t M, int64_t k, int64_t n,
                      bool w_transposed, float beta, const View* y_in = nullptr);
  void accumulate(const View& dst, const float* contribution, int64_t n);
  // rope_forward (backward false) and rope_backward, on fp32 or bf16 x.
  void rope(const char* kn, const View& x, const View& cos, const View& sin, int64_t B, int64_t T,
            int64_t heads, int64_t head_dim, int64_t row_stride, bool backward);

  int device_ = 0;
  std::string name_;
  int sm_ = 0;  // compute capability as major * 10 + minor
  cudaStream_t stream_ = nullptr;
  Buffer gemm_workspace_;        // cuBLASLt's, made once
  std::unique_ptr<LtGemm> gemm_;  // the products' plans, one per shape
  std::shared_ptr<CachingAllocator> allocator_;  // shared with the deleters of live buffers
  void* staging_ = nullptr;
  int64_t staging_bytes_ = 0;
  // alloc_host's live blocks (base -> bytes), shared with the deleters of its
  // buffers: to_host copies straight into them.
  struct HostBlocks {
    std::mutex mu;
    std::map<uintptr_t, int64_t> blocks;
    int64_t bytes = 0;
  };
  std::shared_ptr<HostBlocks> host_blocks_ = std::make_shared<HostBlocks>();
  bool in_host_block(const void* p, int64_t bytes) const;
  // The snapshot's stream and events, made once; snap_fence_due_: the
  // compute stream has not yet been made to wait for the last snapshot.
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t snap_from_ = nullptr, snap_done_ = nullptr;
  bool snap_fence_due_ = false;
  std::map<uint64_t, cudaEvent_t> events_;  // recorded and not yet known complete
  std::vector<cudaEvent_t> free_events_;
  uint64_t last_event_ = 0;
};

// The bf16 dense tensor-core peak FLOP/s of a GPU by its device name, 0 for
// one the table does not know.
double gpu_peak_flops(const std::string& device_name);

}  // namespace amsp::backend
