// The compute backend: the one interface through which the model and the
// sharding engine allocate memory, run kernels, order work and get their
// communicators. doc/engine.md ("The compute backend") says why it looks like
// this; in short, as in ggml, one small table of operations that each backend
// implements whole, the CPU backend first and as the reference, and as in
// llm.c, the per-element math written once (kernels/common/math.h) and shared
// by every backend's kernels.
//
// Ordering. A backend has one compute stream: kernels run in the order they
// are called. On the CPU backend a call returns when its work is done; a device
// backend may return at once. Communication is ordered against compute by the
// communicators the backend makes (make_communicator): an op reads its send
// buffer as the compute stream leaves it at the moment the op is issued, and
// after Handle::wait() compute called later sees what the op wrote. Events mark
// a point of the compute stream for anything else that must wait for it.
//
// Precision. compute() is the dtype matrix products take their inputs in:
// fp32, or bf16, in which case both inputs are rounded to bf16 and the
// products are accumulated in fp32 with beta * y added in fp32, the result
// stored once in y's dtype (fp32, or rounded to bf16): what a GPU's bf16
// tensor-core GEMM with fp32 accumulation and its epilogue do. So a product
// into the fp32 residual stream (beta = 1) adds its unrounded sum, and weight
// gradients accumulate in the GEMM (beta = 1 into the gradient, rounded once
// when it is bf16, as Megatron and llm.c accumulate them). Activations are fp32, except
// where a kernel below says it also takes bf16 ones; parameters and gradients may
// be fp32 or bf16 (the kernels below say which dtypes they take). Everything
// else (norms, softmax, losses, optimizer) computes in fp32.
//
// Kernels follow kernels/cpu/ops.h: the same layouts ([rows, features]
// row-major activations, [out, in] weights), the same semantics (*_backward
// accumulates into parameter gradients; forward outputs are overwritten).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/buffer.h"
#include "comm/communicator.h"
#include "core/dtype.h"
#include "kernels/common/math.h"
#include "kernels/common/quant.h"

namespace amsp::backend {

class StreamTimer;  // backend/stream_timer.h

// A point on the compute stream.
struct Event {
  uint64_t id = 0;  // 0: already complete
};

struct MemoryStats {
  int64_t in_use = 0;    // bytes currently allocated through alloc()
  int64_t peak = 0;      // the most that were at any time
  int64_t reserved = 0;  // a caching device allocator: bytes taken from the
                         // device, cached free blocks included (0 on the CPU)
  int64_t host = 0;      // bytes of host staging memory live through alloc_host()
};

// What a backend's device has done so far, as the CUDA emulation counts it
// (kernels/cuda/emu/runtime.h, device_counts): stream operations, host
// synchronisations, device-memory bytes read and written, FLOPs on tensor
// cores and on other units. `counted` is false where nothing counts them (the
// CPU, a real GPU).
struct DeviceCounts {
  bool counted = false;
  int64_t launches = 0;
  int64_t host_syncs = 0;
  int64_t bytes_read = 0, bytes_written = 0;
  double tensor_flops = 0, simt_flops = 0;
};

// RoPE tables (rope_table's cos and sin, [max_T, head_dim/2]) for attention's
// backward, which rotates dq and dk back as it writes them; empty views: no
// rotation.
struct RopeTables {
  View cos, sin;
  // The tables as the kernels take them (checked by the backend's Checks first).
  kernels::Rotary rotary() const {
    if (cos.empty()) return {};
    return kernels::Rotary{static_cast<const float*>(cos.data), static_cast<const float*>(sin.data)};
  }
};

struct LossSum {
  double sum = 0;     // cross-entropy summed over valid targets, in row order
  int64_t count = 0;  // valid targets
};

// One AdamW update with decoupled weight decay, as torch.optim.AdamW does it
// (kernels/common/math.h: adamw_update_element). The gradient is multiplied by
// grad_scale first (clipping).
struct AdamWStep {
  float lr = 0, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0;
  float bias_correction1 = 1, bias_correction2 = 1;  // 1 - beta^step
  float grad_scale = 1;
  View scale;  // fp32 [1] on the backend; when set, it multiplies the gradient instead of grad_scale
};

// One part of Backend::adamw_parts: a tensor's (or a slice's) views, as adamw
// takes them, and its weight decay. With master_out, m_out and v_out (all
// three, fp32, each the size of master) the update is out of place: master, m
// and v are only read, and the updated values go there instead (the same
// arithmetic, element by element).
struct AdamWPart {
  View master, m, v, grad, param_copy;
  float weight_decay = 0;
  View master_out, m_out, v_out;
  bool out_of_place() const { return !master_out.empty() || !m_out.empty() || !v_out.empty(); }
};

// A loss accumulator (Backend::cross_entropy_forward_into) read back to the
// host: throws the Error cross_entropy_forward would have thrown if a target
// was outside the vocabulary of V.
void check_loss_acc(const double* acc, int64_t V);

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Device device() const = 0;
  // One line for logs: "cpu (OpenBLAS Zen, 2 threads)".
  virtual std::string describe() const = 0;
  DType compute() const { return compute_; }

  // ---- memory ------------------------------------------------------------
  // count zeroed elements of dtype on this backend's device.
  virtual Buffer alloc(DType dtype, int64_t count) = 0;
  virtual MemoryStats memory() const = 0;
  // The device memory a plan may use on this rank, in bytes: on a GPU what is
  // free on it now (asked before the run reserves its working set: what the
  // driver, other processes and this one hold already is not); 0 where memory
  // is the host's, which the node's ranks share.
  virtual int64_t device_memory_free() const = 0;
  // count fp32 elements of host memory to stage device data in (a background
  // checkpoint's snapshot): a Buffer whose view is host memory (Device::kCpu,
  // f32() works) that to_host/from_host copy to and from fast. Ordinary memory
  // on the CPU backend; page-locked (cudaHostAlloc) on CUDA, so that the copy
  // from the device is a DMA that can run asynchronously. Not zeroed. Counted
  // in memory().host while it lives.
  virtual Buffer alloc_host(int64_t count) = 0;
  // Host <-> device, converting between fp32 (host) and the view's dtype; int32
  // views (token ids, quantized records) as they are.
  virtual void to_host(const View& src, float* dst) = 0;
  virtual void to_host(const View& src, int32_t* dst) = 0;
  virtual void from_host(const float* src, const View& dst) = 0;
  virtual void from_host(const int32_t* src, const View& dst) = 0;

  // ---- ordering -----------------------------------------------------------
  virtual Event record() = 0;                // marks the compute stream's current point
  virtual void wait(const Event& event) = 0;  // the host waits until the stream passed it
  virtual void synchronize() = 0;             // the host waits for all work issued so far
  // Times the host has waited for the device so far (a download, an upload
  // through the staging buffer, wait, synchronize); 0 on the CPU, whose
  // compute is the host.
  virtual int64_t host_syncs() const { return 0; }
  // Opens (true) or closes the device profiler's capture range
  // (cudaProfilerStart/Stop), which `ncu --profile-from-start off` and `nsys
  // --capture-range=cudaProfilerApi` honour. Nothing where there is no device.
  virtual void profiler_capture(bool /*on*/) {}
  // Sets device memory aside for the run's working set at start-up, so that
  // the step allocates from it without asking the device (which would
  // synchronise); `predicted_peak` is the prediction of all this rank's
  // backend will hold at once (what it holds already included), which an
  // out-of-memory error names. Nothing where memory is the host's.
  virtual void reserve(int64_t predicted_peak) { (void)predicted_peak; }
  // The device's counts on the calling thread so far (DeviceCounts).
  virtual DeviceCounts device_counts() const { return {}; }

  // ---- snapshots: device -> host beside compute ---------------------------------
  // A background checkpoint's copy of the states (doc/checkpoints.md,
  // "Background saves"). begin_snapshot copies each source (fp32) into its
  // destination (memory from alloc_host), as the compute stream leaves the
  // source at this call, and returns without waiting for the copies: a device
  // runs them on a copy stream of its own, beside the compute issued after.
  // Compute that writes a source must be issued after fence_snapshot(), which
  // makes the compute stream wait for the copies on the device (the host does
  // not wait). The host reads a destination after wait_snapshot(), which any
  // one thread may call while the training thread goes on. One snapshot at a
  // time: the next begins after wait_snapshot has returned. On the CPU the
  // copies are made at once and the other two do nothing.
  struct HostCopy {
    View src;
    float* dst = nullptr;
  };
  virtual void begin_snapshot(const std::vector<HostCopy>& copies) = 0;
  virtual void fence_snapshot() = 0;
  virtual void wait_snapshot() = 0;
  // A timer of this backend's calls' work, for the kernel profile
  // (profiled_backend.h); the backend costs nothing more until one is made.
  virtual std::unique_ptr<StreamTimer> make_stream_timer() = 0;

  // ---- communication ------------------------------------------------------
  // A communicator over `group` that is ordered against this backend's compute
  // stream as described above (MPI for the CPU backend, NCCL for CUDA).
  virtual std::unique_ptr<comm::Communicator> make_communicator(comm::Group group) = 0;

  // ---- elementwise and reductions -----------------------------------------
  virtual void fill_zero(const View& x) = 0;
  // dst = src, converting dtype (round to nearest even into bf16). Equal counts.
  virtual void copy(const View& src, const View& dst) = 0;
  // dst += src, in fp32, rounded to dst's dtype. Equal counts.
  virtual void add(const View& dst, const View& src) = 0;
  // Sum of squares in double, in a fixed order whatever the thread count.
  virtual double sum_squares(const View& x) = 0;

  // ---- compression: block quantization (kernels/common/quant.h) ---------------
  // A chunk of n fp32 or bf16 values is one record of quant::record_words(n,
  // spec) int32 words (scales, codes, padding); views of records are kI32.
  // The bits are the same on every backend and thread count (doc/compression.md
  // gives the format, the rounding and the error bound). Each call fails with
  // an Error on an invalid spec, a negative n or records, or a view of another
  // dtype or too small for the call.
  //
  // src: `records` chunks of n values, one after another; dst receives as many
  // records, one after another.
  virtual void quantize(const View& src, int64_t n, int64_t records, const View& dst,
                        const kernels::quant::Spec& spec) = 0;
  // src: `records` records of n values; dst[r n + i] = q * scale of value i of
  // record r (fp32, rounded to nearest even into a bf16 dst).
  virtual void dequantize(const View& src, int64_t n, int64_t records, const View& dst,
                          const kernels::quant::Spec& spec) = 0;
  // src: `records` records of n values (one per source rank of a reduction);
  // dst[i] = the sum over r = 0, 1, ... in that order of q_r[i] * scale_r, each
  // product and each addition rounded to fp32 on its own, then stored in
  // dst's dtype. records == 0 gives zeros.
  virtual void dequantize_sum(const View& src, int64_t n, int64_t records, const View& dst,
                              const kernels::quant::Spec& spec) = 0;

  // ---- the model's kernels -------------------------------------------------
  // out[r, :] = table[tokens[r], :]; dtable[tokens[r], :] += dout[r, :]
  // (deterministic: no floating-point atomics). table, dtable: fp32 or bf16.
  virtual void embedding_forward(const View& tokens, const View& table, const View& out,
                                 int64_t rows, int64_t dim) = 0;
  virtual void embedding_backward(const View& tokens, const View& dout, const View& dtable,
                                  int64_t rows, int64_t dim) = 0;

  // y[M, out] = x[M, in] W^T + beta * y;  dx[M, in] = dy W + beta * dx;
  // dw[out, in] = dy^T x + beta * dw.  w, dw: fp32 or bf16; x, y, dy, dx: activations,
  // fp32, or under bf16 compute bf16 too: a bf16 y (dx) is the fp32 value
  // round(product) + beta * y rounded once more (with beta 0, the product
  // rounded once, which a device's GEMM writes directly).
  virtual void linear_forward(const View& x, const View& w, const View& y, int64_t M, int64_t in,
                              int64_t out, float beta) = 0;
  // y[M, out] = r + x W^T, r and y fp32 (the residual stream's rows), the same
  // matrix or disjoint ones: the bits of linear_forward with beta 1 into a
  // copy of r. The CUDA backend reads r in the product's epilogue instead of
  // copying it first.
  virtual void linear_forward_residual(const View& x, const View& w, const View& r, const View& y,
                                       int64_t M, int64_t in, int64_t out) = 0;
  virtual void linear_backward_input(const View& dy, const View& w, const View& dx, int64_t M,
                                     int64_t in, int64_t out, float beta) = 0;
  virtual void linear_backward_weight(const View& dy, const View& x, const View& dw, int64_t M,
                                      int64_t in, int64_t out, float beta) = 0;

  // RMSNorm (kernels/cpu/ops.h): forward keeps inv_rms [rows]; apply recomputes
  // y from it; backward: dx += ..., dw = ... + dw_beta * dw (dw_beta 0 or 1:
  // a gradient written or added to). w, dw: fp32 or bf16; x, dx,
  // inv_rms fp32 (the residual stream); y and dy fp32 or bf16 (y computed in
  // fp32 and rounded once, dy widened). Backward's dx_bf16, unless empty,
  // receives the updated dx rounded once to bf16, in the same pass: the input
  // the next products of a bf16 model read (a copy of its own otherwise).
  virtual void rmsnorm_forward(const View& x, const View& w, const View& y, const View& inv_rms,
                               int64_t rows, int64_t dim, float eps) = 0;
  virtual void rmsnorm_apply(const View& x, const View& w, const View& inv_rms, const View& y,
                             int64_t rows, int64_t dim) = 0;
  virtual void rmsnorm_backward(const View& dy, const View& x, const View& w, const View& inv_rms,
                                const View& dx, const View& dw, int64_t rows, int64_t dim,
                                const View& dx_bf16, float dw_beta) = 0;

  // RoPE tables [max_T, head_dim/2] and the in-place rotation (backward: by
  // -angle) of fp32 or bf16 x (widened, rotated in fp32, stored rounded). The
  // model rotates q and k with rope_forward, in place, before attention;
  // attention's backward rotates dq and dk back itself (RopeTables), tested
  // against rope_backward.
  virtual void rope_table(const View& cos, const View& sin, int64_t max_T, int64_t head_dim,
                          double theta) = 0;
  virtual void rope_forward(const View& x, const View& cos, const View& sin, int64_t B, int64_t T,
                            int64_t heads, int64_t head_dim, int64_t row_stride) = 0;
  virtual void rope_backward(const View& dx, const View& cos, const View& sin, int64_t B,
                             int64_t T, int64_t heads, int64_t head_dim, int64_t row_stride) = 0;

  // Causal grouped-query attention over the fused projection qkv [B*T, (H +
  // 2 KV) D]: each row holds q (H heads), then k and v (KV heads each), as one
  // matrix product over the adjacent q, k and v weights writes them. `saved` is
  // what forward keeps for backward: attention_saved_count(B, T, H) fp32
  // elements (the CPU backend keeps the softmax probabilities, a fused kernel
  // only a log-sum-exp per row and head). out, dout: [B*T, H*D]. dqkv (the
  // layout of qkv) is overwritten. qkv, out, dout and dqkv are all fp32 or
  // all bf16 (read as they are, computed in fp32, each output rounded once).
  // q and k are taken after RoPE (rope_forward). With rope tables, the q and
  // k parts of dqkv are the gradients with respect to the unrotated q and k
  // (rope_backward of the rotated ones, with one rounding fewer for bf16).
  // Under bf16 compute q, k and v are rounded to bf16 for the products.
  virtual int64_t attention_saved_count(int64_t B, int64_t T, int64_t H) const = 0;
  virtual void attention_forward(const View& qkv, const View& saved, const View& out, int64_t B,
                                 int64_t T, int64_t H, int64_t KV, int64_t D) = 0;
  virtual void attention_backward(const View& qkv, const RopeTables& rope, const View& saved,
                                  const View& out, const View& dout, const View& dqkv, int64_t B,
                                  int64_t T, int64_t H, int64_t KV, int64_t D) = 0;

  // SwiGLU over the fused gate/up projection gate_up [rows, 2 I]: each row
  // holds gate, then up, as one matrix product over the adjacent gate and up
  // weights writes them. out [rows, I] = silu(gate) * up; backward writes
  // dgate_up in gate_up's layout from dout [rows, I]. All four fp32, or all
  // bf16 (widened, computed in fp32, each output rounded once).
  virtual void swiglu_forward(const View& gate_up, const View& out, int64_t rows, int64_t I) = 0;
  virtual void swiglu_backward(const View& gate_up, const View& dout, const View& dgate_up,
                               int64_t rows, int64_t I) = 0;

  // Cross-entropy of fp32 or bf16 logits [rows, V] (target < 0: ignored;
  // target >= V: Error). lse [rows] is kept for backward, which turns logits in
  // place into scale * (softmax - onehot). The forward returns to the host.
  virtual LossSum cross_entropy_forward(const View& logits, const View& targets, const View& lse,
                                        int64_t rows, int64_t V) = 0;
  virtual void cross_entropy_backward(const View& logits, const View& targets, const View& lse,
                                      int64_t rows, int64_t V, float scale) = 0;

  // ---- the training step's scalars, kept on the backend ------------------------
  // So that a device step needs one host synchronisation, at its end.
  //
  // Host -> device without waiting: src is memory from alloc_host that the
  // caller leaves untouched until a later synchronisation has passed the copy
  // (a plain copy on the CPU).
  virtual void from_host_async(const int32_t* src, const View& dst) = 0;
  // fp64 values to the host (waits for the stream).
  virtual void to_host_f64(const View& src, double* dst) = 0;
  // cross_entropy_forward, its loss added into acc (fp64 [4]) instead of
  // returned: acc[0] += the sum over valid targets (in row order on the CPU, in
  // a fixed order of its own on a device), acc[1] += their count. A target >= V
  // is an Error at once on the CPU; a device records the first
  // (acc[2] = row + 1, acc[3] = target) for check_loss_acc.
  virtual void cross_entropy_forward_into(const View& logits, const View& targets, const View& lse,
                                          int64_t rows, int64_t V, const View& acc) = 0;
  // acc (fp64 [1]) += sum_squares(x): the host's double addition, on the backend.
  virtual void sum_squares_into(const View& x, const View& acc) = 0;
  // scale (fp32 [1]) = max_norm / (norm + 1e-6) if max_norm > 0 and norm >
  // max_norm, else 1, for norm = sqrt(sumsq[0] / divisor) (fp64 sumsq).
  virtual void clip_scale(const View& sumsq, double divisor, double max_norm, const View& scale) = 0;

  // ---- the optimizer ---------------------------------------------------------
  // AdamW over equal-length views: master (fp32) parameters, moments m and v
  // (fp32), grad (fp32 or bf16). If param_copy is not empty it receives the
  // updated master in its own dtype (the bf16 parameters the model computes with).
  virtual void adamw(const View& master, const View& m, const View& v, const View& grad,
                     const View& param_copy, const AdamWStep& step) = 0;
  // The same over several parts (an OS-shard's tensors), each with its own
  // weight decay (step.weight_decay is not read): what adamw does to each, in
  // one pass where the device can (the CUDA backend: one launch per 16 parts).
  // Parts may be out of place (AdamWPart).
  virtual void adamw_parts(const std::vector<AdamWPart>& parts, const AdamWStep& step) = 0;

  // ---- throughput -----------------------------------------------------------
  // The peak matrix-product FLOP/s that MFU is measured against: measured on
  // the CPU backend (a large GEMM on this process's threads), a table by
  // device name on a GPU.
  virtual double peak_flops() = 0;

 protected:
  explicit Backend(DType compute) : compute_(compute) {}

 private:
  DType compute_;
};

// The CPU backend: kernels/cpu (OpenBLAS + OpenMP), MPI communicators.
// compute: kF32 or kBF16.
std::unique_ptr<Backend> make_cpu_backend(DType compute);

// The CUDA backend (backend/cuda_backend.h) on CUDA device `device`, which it
// makes current: a GPU in a -DAMSP_CUDA=ON build, the CPU emulation of CUDA in
// any other. compute: kF32 or kBF16.
std::unique_ptr<Backend> make_cuda_backend(DType compute, int device);

}  // namespace amsp::backend
