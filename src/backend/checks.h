// The argument checks of the compute backends (internal to src/backend): one
// set for the CPU and the CUDA backend, so that both reject the same calls with
// the same words. Every check fails with one line that starts with the kernel's
// name and names the view or size at fault.
//
// A Checks is made for the memory its backend reads: the CPU backend reads host
// memory only; the CUDA backend device memory only, except that it takes empty
// views from anywhere (View{} is a host view, and an empty view is never read).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "backend/buffer.h"
#include "kernels/common/quant.h"

namespace amsp::backend {

class Backend;
struct AdamWPart;
struct RopeTables;

class Checks {
 public:
  constexpr explicit Checks(Device device) : device_(device) {}

  // A view and the name a message calls it by.
  struct Arg {
    const char* name;
    const View& view;
  };

  // ---- sizes: the same on every device ------------------------------------------

  // Sizes must not be negative.
  static void sizes(const char* kernel, std::initializer_list<std::pair<const char*, int64_t>> sizes);
  // The product of non-negative sizes; Error if it overflows int64.
  static int64_t product(const char* kernel, std::initializer_list<int64_t> sizes);
  // v must hold at least n elements.
  static void need(const char* kernel, const char* name, const View& v, int64_t n);

  // ---- views --------------------------------------------------------------------

  // v must be memory this backend reads.
  void device(const char* kernel, const char* name, const View& v) const;
  // v must be of dtype t.
  void expect(const char* kernel, const char* name, const View& v, DType t) const;
  // Every view must be of dtype t.
  void expect_all(const char* kernel, DType t, std::initializer_list<Arg> args) const;
  // v must be fp32 or bf16 (a parameter, a gradient, or an operand of copy/add).
  void expect_float(const char* kernel, const char* name, const View& v) const;
  // Activations of one kernel: the first fp32 or bf16, the others of its dtype.
  void expect_activations(const char* kernel, std::initializer_list<Arg> args) const;
  // The matrix products take bf16 activations under bf16 compute only: with
  // compute fp32 every view named must be fp32.
  void product_activations(const char* kernel, DType compute, std::initializer_list<Arg> args) const;

  // ---- the backend: construction, memory, ordering ----------------------------------

  // The compute dtype must be fp32 or bf16.
  void compute(DType dtype) const;
  // The bytes of `count` elements of dtype; count must not be negative.
  static int64_t alloc_bytes(DType dtype, int64_t count);
  // wait() takes only events this backend recorded: ids up to `last`.
  static void event(int64_t id, int64_t last);

  // ---- elementwise ------------------------------------------------------------------

  // Both views on this device and of one count (their dtypes are the caller's:
  // alike, or both fp32/bf16).
  void copy(const View& src, const View& dst) const;
  void add(const View& dst, const View& src) const;

  // ---- the model's kernels: cpu_backend.h and cuda_backend.h state the shapes --------

  // Returns the table's rows (the vocabulary); the token values are not read.
  int64_t embedding(const char* kernel, const View& tokens, const View& table, const char* table_name,
                    const View& rows_view, const char* rows_name, int64_t rows, int64_t dim) const;
  // y[M, y_cols] from a[M, a_cols] and w[out, in]: linear_forward (a = x,
  // y = y) and linear_backward_input (a = dy, y = dx).
  void linear(const char* kernel, int64_t M, int64_t in, int64_t out, const View& a, const char* a_name,
              int64_t a_cols, const View& w, const View& y, const char* y_name, int64_t y_cols) const;
  // beta: 0 (dw written) or 1 (added to).
  void linear_backward_weight(const View& dy, const View& x, const View& dw, int64_t M, int64_t in,
                              int64_t out, float beta) const;
  // linear(x -> y) with y = r + x W^T: r and y fp32 [M, out], one matrix or disjoint.
  void linear_forward_residual(const View& x, const View& w, const View& r, const View& y,
                               int64_t M, int64_t in, int64_t out) const;
  void rmsnorm(const char* kernel, const View& x, const View& w, const View& y, const char* y_name,
               const View& inv_rms, int64_t rows, int64_t dim) const;
  void rmsnorm_backward(const View& dy, const View& x, const View& w, const View& inv_rms,
                        const View& dx, const View& dw, int64_t rows, int64_t dim,
                        const View& dx_bf16, float dw_beta) const;
  // Returns max_T * head_dim / 2, the elements of each table.
  int64_t rope_table(const View& cos, const View& sin, int64_t max_T, int64_t head_dim) const;
  void rope(const char* kernel, const View& x, const View& cos, const View& sin, int64_t B, int64_t T,
            int64_t heads, int64_t head_dim, int64_t row_stride) const;
  // `saved` must hold backend.attention_saved_count(B, T, H) elements.
  void attention_forward(const Backend& backend, const View& qkv, const View& saved,
                         const View& out, int64_t B, int64_t T, int64_t H, int64_t KV,
                         int64_t D) const;
  // out: nullptr where the backend does not read it. rope: both tables empty,
  // or both fp32 with T * D / 2 values (D even).
  void attention_backward(const Backend& backend, const View& qkv, const RopeTables& rope,
                          const View& saved, const View* out, const View& dout, const View& dqkv,
                          int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) const;
  void swiglu_forward(const View& gate_up, const View& out, int64_t rows, int64_t I) const;
  void swiglu_backward(const View& gate_up, const View& dout, const View& dgate_up, int64_t rows,
                       int64_t I) const;
  void cross_entropy(const char* kernel, const View& logits, const View& targets, const View& lse,
                     int64_t rows, int64_t V) const;
  void adamw(const View& master, const View& m, const View& v, const View& grad,
             const View& param_copy) const;
  // adamw's checks, and an out-of-place part's outputs: all three, fp32, on
  // the backend, each as large as master.
  void adamw_part(const AdamWPart& part) const;

  // ---- compression (kernels/common/quant.h) ---------------------------------------
  // A valid spec, n and records not negative; `values` fp32 or bf16 holding
  // `chunks` chunks of n values (records, or 1 for dequantize_sum's sum);
  // `records_view` int32 holding `records` records of n values. Returns the
  // words of one record.
  int64_t quant(const char* kernel, const kernels::quant::Spec& spec, int64_t n, int64_t records,
                const View& values, const char* values_name, int64_t chunks,
                const View& records_view, const char* records_name) const;

 private:
  Device device_;
};

}  // namespace amsp::backend
