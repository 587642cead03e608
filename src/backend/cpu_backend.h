// The CPU backend: the reference implementation of backend/backend.h, on
// kernels/cpu (OpenBLAS sgemm + OpenMP) and MPI communicators.
//
// fp32. With compute() == kF32 and fp32 parameters and gradients every kernel
// is a direct call of the kernels/cpu function with the views' pointers, so its
// results are bit-identical to calling that function (the PyTorch comparisons
// of the test suite rest on it). sum_squares sums squares in double over fixed
// chunks of 16384 elements and then the chunks in order, as the engine's
// optimizer always has; adamw is adamw_update_element per element, with the
// gradient first multiplied by grad_scale in fp32 when grad_scale != 1 (the
// same arithmetic as scaling the gradient in place and then updating).
//
// bf16. bf16 is a storage format here: every value is widened to fp32 (exactly)
// before arithmetic, and rounded to nearest even when stored.
//   - Weights, norm weights and the embedding table may be bf16: they are
//     widened into a workspace the backend owns and the fp32 kernel runs on the
//     copy (embedding_forward widens the rows it gathers straight into `out`,
//     the same values without a copy of the table).
//   - compute() == kBF16 changes the three linear kernels only. Both inputs are
//     rounded to bf16 (fp32 weights and activations; bf16 ones already are),
//     and sgemm accumulates the exact bf16 x bf16 products and beta * y in
//     fp32, stored once in the output's dtype (store: as it is into fp32,
//     rounded into bf16), as a GPU's GEMM and its epilogue do:
//         y  = store(round(x) round(W)^T + beta * y)
//         dx = store(round(dy) round(W) + beta * dx)
//         dw = store(dw + round(dy)^T round(x))
//     With beta == 0, y (dx) is not read, as with BLAS. Attention takes q, k,
//     v (and dout) rounded to bf16 and computes in fp32 from them, as the
//     CUDA backend's kernels read them (which also round their probabilities
//     to bf16: doc/engine-tests.md bounds the difference). Norms, softmax,
//     losses and the optimizer compute in fp32 whatever compute() is.
//   - Gradients of parameters may be bf16 (dw of linear_backward_weight and
//     rmsnorm_backward, dtable of embedding_backward). The call's whole
//     contribution is computed in fp32, then each element is stored once as
//     round(dw + contribution): one rounding per element per call, never one
//     per summand. embedding_backward into a bf16 table groups rows by token
//     (a counting sort, stable in row order), sums each token's rows in fp32 in
//     row order and adds the sum to the table row, in parallel over tokens.
//   - copy() converts with round to nearest even (bf16 <-> fp32; int32 only to
//     int32); add() computes dst + src in fp32 and rounds to dst's dtype.
//   - adamw: master, m and v fp32; grad fp32 or bf16; param_copy empty, fp32 or
//     bf16, written from the updated master.
//   - to_host widens, from_host rounds.
//   - Activations may be bf16 where backend.h says so (swiglu, rope, rmsnorm's
//     y and dy, attention, cross-entropy's logits; the products' as above):
//     widened, the fp32 kernel's arithmetic, each output rounded once.
//   - quantize reads fp32 or bf16 values; dequantize and dequantize_sum store
//     fp32 or bf16 (kernels/cpu quant.cpp, doc/compression.md).
//
// Attention keeps the softmax probabilities: attention_saved_count is
// B * H * T * T, and attention_backward does not read `out`.
//
// Checks. Every kernel checks the dtype and device of each view it is given and
// that each view holds the elements the kernel will touch, and fails with one
// line naming the kernel and the view (amsp::Error); token ids are checked
// against the table. A too-small view is an Error, never a stray write.
//
// Determinism. OpenMP loops use static schedules and there are no floating
// atomics: the same inputs give bit-identical outputs with the same thread
// count. The bf16 embedding backward's result does not depend on the thread
// count at all (each token's rows are summed by one thread, in row order).
//
// Ordering. Every call returns when its work is done, so record() only numbers
// points of the stream, and wait() and synchronize() have nothing to wait for.
//
// Memory. alloc() returns zeroed, 64-byte-aligned host memory; memory() counts
// the bytes of live buffers (a buffer may outlive the backend). The conversion
// workspace is not allocated through alloc() and is not counted there
// (workspace_bytes()); each of its slots grows to the largest request and is
// then reused: the rounded copies of a linear kernel's inputs and its product,
// attention's inputs and output in fp32, the bf16 embedding gradient's sort.
//
// A CpuBackend is one compute stream: call it from one thread at a time.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"

namespace amsp::backend {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(DType compute);  // kF32 or kBF16, else Error
  ~CpuBackend() override;

  Device device() const override { return Device::kCpu; }
  std::string describe() const override;

  Buffer alloc(DType dtype, int64_t count) override;
  Buffer alloc_host(int64_t count) override;
  MemoryStats memory() const override;
  int64_t device_memory_free() const override { return 0; }
  void to_host(const View& src, float* dst) override;
  void to_host(const View& src, int32_t* dst) override;
  void from_host(const float* src, const View& dst) override;
  void from_host(const int32_t* src, const View& dst) override;

  Event record() override;
  void wait(const Event& event) override;
  void synchronize() override;
  std::unique_ptr<StreamTimer> make_stream_timer() override;  // wall time around each call

  std::unique_ptr<comm::Communicator> make_communicator(comm::Group group) override;

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
  // The snapshot's copies are plain copies, made at once; nothing to fence or wait for.
  void begin_snapshot(const std::vector<HostCopy>& copies) override;
  void fence_snapshot() override {}
  void wait_snapshot() override {}
  void cross_entropy_forward_into(const View& logits, const View& targets, const View& lse, int64_t rows,
                                  int64_t V, const View& acc) override;
  void sum_squares_into(const View& x, const View& acc) override;
  void clip_scale(const View& sumsq, double divisor, double max_norm, const View& scale) override;
  void cross_entropy_backward(const View& logits, const View& targets, const View& lse,
                              int64_t rows, int64_t V, float scale) override;

  void adamw(const View& master, const View& m, const View& v, const View& grad,
             const View& param_copy, const AdamWStep& step) override;
  void adamw_parts(const std::vector<AdamWPart>& parts, const AdamWStep& step) override;

  // Best FLOP/s of an n = 1536 sgemm over four timed runs after a warm-up, on
  // this process's threads; measured at every call (about a quarter second).
  double peak_flops() override;

  // Bytes held by the conversion workspace (not part of memory()).
  int64_t workspace_bytes() const;

 private:
  // Grow-only scratch, one block per slot; a slot's contents are undefined
  // after it is requested again. Slots a kernel uses at the same time differ.
  enum Slot {
    kSlotX, kSlotW, kSlotOut, kSlotIndex, kSlotIndex2, kSlotIndex3,
    kSlotQkv, kSlotDout,  // attention's inputs in fp32 (rounded to bf16, or widened)
    kNumSlots
  };
  void* scratch(Slot slot, int64_t bytes);
  float* scratch_f32(Slot slot, int64_t n) {
    return static_cast<float*>(scratch(slot, n * int64_t{sizeof(float)}));
  }
  int64_t* scratch_i64(Slot slot, int64_t n) {
    return static_cast<int64_t*>(scratch(slot, n * int64_t{sizeof(int64_t)}));
  }
  // The values of a parameter view in fp32: its own memory if fp32, else a
  // widened copy in `slot`.
  const float* f32_values(const View& v, Slot slot);
  // The values of a view rounded to bf16, in fp32: a rounded (fp32) or widened
  // (bf16) copy in `slot`.
  const float* bf16_values(const View& v, Slot slot);
  // An activation attention reads, in fp32: rounded to bf16 in `slot` when
  // compute() is kBF16, else its own memory (fp32) or widened (bf16).
  const float* attention_input(const View& x, Slot slot);
  // Where attention writes an output in fp32: its own memory (fp32) or
  // `slot`, which finish_attention_output then rounds into x (bf16).
  float* attention_output(const View& x, Slot slot);
  void finish_attention_output(const View& x, const float* values);
  // Where a product (linear_forward, linear_backward_input) accumulates into
  // y in fp32: y itself, or a bf16 y widened into kSlotOut (when beta reads
  // it); store_product then rounds it into a bf16 y.
  float* product_target(const View& y, float beta);
  void linear_product(const View& a, const View& w, const View& y, int64_t M, int64_t k, int64_t n,
                      bool forward, float beta);
  void store_product(const View& y, const float* p);
  // Stores dst = dst + contribution[i] (fp32 add) into an fp32 or bf16 view,
  // rounding once per element.
  void accumulate_gradient(const View& dst, const float* contribution, int64_t n);
  void adamw_part(const AdamWPart& part, const AdamWStep& step);
  void embedding_backward_bf16(const int32_t* tokens, const float* dout, uint16_t* dtable,
                               int64_t rows, int64_t dim, int64_t vocab);

  struct Counters;
  std::shared_ptr<Counters> counters_;  // shared with the deleters of live buffers
  struct Block {
    void* data = nullptr;
    int64_t bytes = 0;
  };
  std::array<Block, kNumSlots> scratch_{};
  uint64_t last_event_ = 0;
};

}  // namespace amsp::backend
