// The CPU backend's kernels whose parameters or gradients may be bf16
// (embedding, linear, RMSNorm, AdamW), and the bf16 matrix products.
// cpu_backend.h states the semantics; fp32 views go straight to kernels/cpu.
#include <omp.h>

#include <cstring>
#include <type_traits>

#include "backend/cpu_backend.h"
#include "backend/checks.h"
#include "backend/cpu_convert.h"
#include "core/error.h"
#include "kernels/cpu/ops.h"

namespace amsp::backend {

using namespace cpu;
namespace k = amsp::kernels;

namespace {

constexpr Checks check(Device::kCpu);

}  // namespace

// ---- conversion helpers ------------------------------------------------------------

const float* CpuBackend::f32_values(const View& v, Slot slot) {
  if (v.dtype == DType::kF32) return v.f32();
  float* dst = scratch_f32(slot, v.count);
  widen(v.bf16(), dst, v.count);
  return dst;
}

const float* CpuBackend::bf16_values(const View& v, Slot slot) {
  float* dst = scratch_f32(slot, v.count);
  if (v.dtype == DType::kBF16)
    widen(v.bf16(), dst, v.count);
  else
    round_values(v.f32(), dst, v.count);
  return dst;
}

void CpuBackend::accumulate_gradient(const View& dst, const float* c, int64_t n) {
  if (dst.dtype == DType::kF32) {
    float* d = dst.f32();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) d[i] += c[i];
  } else {
    uint16_t* d = dst.bf16();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) d[i] = k::float_to_bf16(k::bf16_to_float(d[i]) + c[i]);
  }
}

// ---- embedding ---------------------------------------------------------------------

namespace {

// Checks an embedding call, and its tokens (on the host, so the CPU backend can);
// returns the table's number of rows (the vocabulary).
int64_t check_embedding(const char* kn, const View& tokens, const View& table,
                        const char* table_name, const View& rows_view, const char* rows_name,
                        int64_t rows, int64_t dim) {
  const int64_t vocab = check.embedding(kn, tokens, table, table_name, rows_view, rows_name, rows, dim);
  const int32_t* t = tokens.i32();
  for (int64_t r = 0; r < rows; ++r)
    if (t[r] < 0 || (dim > 0 && t[r] >= vocab))
      fail(kn, ": token ", t[r], " at row ", r, " is outside ", table_name, "'s ", vocab,
           " rows of ", dim);
  return vocab;
}

}  // namespace

void CpuBackend::embedding_forward(const View& tokens, const View& table, const View& out,
                                   int64_t rows, int64_t dim) {
  const char* kn = "embedding_forward";
  check_embedding(kn, tokens, table, "table", out, "out", rows, dim);
  if (table.dtype == DType::kF32) {
    k::embedding_forward(tokens.i32(), table.f32(), out.f32(), rows, dim);
    return;
  }
  // Widen the gathered rows straight into out: the values the fp32 kernel would
  // copy from a widened table.
  const int32_t* t = tokens.i32();
  const uint16_t* tab = table.bf16();
  float* o = out.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* src = tab + static_cast<int64_t>(t[r]) * dim;
    float* dst = o + r * dim;
#pragma omp simd
    for (int64_t j = 0; j < dim; ++j) dst[j] = k::bf16_to_float(src[j]);
  }
}

void CpuBackend::embedding_backward(const View& tokens, const View& dout, const View& dtable,
                                    int64_t rows, int64_t dim) {
  const char* kn = "embedding_backward";
  const int64_t vocab = check_embedding(kn, tokens, dtable, "dtable", dout, "dout", rows, dim);
  if (dtable.dtype == DType::kF32)
    k::embedding_backward(tokens.i32(), dout.f32(), dtable.f32(), rows, dim);
  else
    embedding_backward_bf16(tokens.i32(), dout.f32(), dtable.bf16(), rows, dim, vocab);
}

void CpuBackend::embedding_backward_bf16(const int32_t* tokens, const float* dout, uint16_t* dtable,
                                         int64_t rows, int64_t dim, int64_t vocab) {
  if (rows == 0 || dim == 0) return;
  // Counting sort of the rows by token, stable: begin[t] .. begin[t + 1] are
  // the positions in `order` of token t's rows, in row order.
  int64_t* begin = scratch_i64(kSlotIndex, vocab + 1);
  int64_t* order = scratch_i64(kSlotIndex2, rows);
  std::memset(begin, 0, static_cast<size_t>(vocab + 1) * sizeof(int64_t));
  for (int64_t r = 0; r < rows; ++r) ++begin[tokens[r] + 1];
  int64_t distinct = 0;
  for (int64_t t = 0; t < vocab; ++t) {
    distinct += begin[t + 1] > 0;
    begin[t + 1] += begin[t];
  }
  // Each token's next free position; then the distinct tokens in increasing order.
  int64_t* next = scratch_i64(kSlotIndex3, vocab + distinct);
  std::memcpy(next, begin, static_cast<size_t>(vocab) * sizeof(int64_t));
  for (int64_t r = 0; r < rows; ++r) order[next[tokens[r]]++] = r;
  int64_t* used = next + vocab;
  for (int64_t t = 0, i = 0; t < vocab; ++t)
    if (begin[t + 1] > begin[t]) used[i++] = t;

  // One fp32 accumulator row per thread; each token's rows are summed in row
  // order by one thread, so the result does not depend on the thread count.
  float* acc_all = scratch_f32(kSlotOut, static_cast<int64_t>(omp_get_max_threads()) * dim);
#pragma omp parallel
  {
    float* acc = acc_all + static_cast<int64_t>(omp_get_thread_num()) * dim;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < distinct; ++i) {
      const int64_t t = used[i];
      const float* first = dout + order[begin[t]] * dim;
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j) acc[j] = first[j];
      for (int64_t p = begin[t] + 1; p < begin[t + 1]; ++p) {
        const float* src = dout + order[p] * dim;
#pragma omp simd
        for (int64_t j = 0; j < dim; ++j) acc[j] += src[j];
      }
      uint16_t* dst = dtable + t * dim;
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j)
        dst[j] = k::float_to_bf16(k::bf16_to_float(dst[j]) + acc[j]);
    }
  }
}

// ---- linear --------------------------------------------------------------------------

// Under bf16 compute a product reads its inputs rounded to bf16 and is then the
// fp32 one: the sum and beta * y accumulated in fp32, as a GEMM's epilogue does,
// and stored once in y's dtype (a bf16 y through a widened copy in kSlotOut).
float* CpuBackend::product_target(const View& y, float beta) {
  if (y.dtype == DType::kF32) return y.f32();
  float* p = scratch_f32(kSlotOut, y.count);
  if (beta != 0.0f) widen(y.bf16(), p, y.count);
  return p;
}

void CpuBackend::store_product(const View& y, const float* p) {
  if (y.dtype == DType::kBF16) round_to_bf16(p, y.bf16(), y.count);
}

// y[M, n] = a[M, k] op(w) + beta y: linear_forward's x W^T (w [n, k]) or
// linear_backward_input's dy W (w [k, n]), the operands rounded to bf16 under
// bf16 compute, accumulated and stored as product_target says.
void CpuBackend::linear_product(const View& a, const View& w, const View& y, int64_t M, int64_t k, int64_t n,
                                bool forward, float beta) {
  if (M == 0 || n == 0) return;
  const bool bf = compute() == DType::kBF16;
  const View av = a.at(0, M * k), wv = w.at(0, n * k), yv = y.at(0, M * n);
  const float* ar = bf ? bf16_values(av, kSlotX) : av.f32();
  const float* wr = bf ? bf16_values(wv, kSlotW) : f32_values(wv, kSlotW);
  float* p = product_target(yv, beta);
  if (forward)
    k::linear_forward(ar, wr, p, M, k, n, beta);
  else
    k::linear_backward_input(ar, wr, p, M, n, k, beta);
  store_product(yv, p);
}

void CpuBackend::linear_forward(const View& x, const View& w, const View& y, int64_t M, int64_t in,
                                int64_t out, float beta) {
  const char* kn = "linear_forward";
  check.linear(kn, M, in, out, x, "x", in, w, y, "y", out);
  check.product_activations(kn, compute(), {{"x", x}, {"y", y}});
  linear_product(x, w, y, M, in, out, true, beta);
}

void CpuBackend::linear_forward_residual(const View& x, const View& w, const View& r, const View& y,
                                         int64_t M, int64_t in, int64_t out) {
  check.linear_forward_residual(x, w, r, y, M, in, out);
  if (r.data != y.data) copy(r.at(0, M * out), y.at(0, M * out));
  linear_forward(x, w, y, M, in, out, 1.0f);
}

void CpuBackend::linear_backward_input(const View& dy, const View& w, const View& dx, int64_t M,
                                       int64_t in, int64_t out, float beta) {
  const char* kn = "linear_backward_input";
  check.linear(kn, M, in, out, dy, "dy", out, w, dx, "dx", in);
  check.product_activations(kn, compute(), {{"dy", dy}, {"dx", dx}});
  linear_product(dy, w, dx, M, out, in, false, beta);
}

void CpuBackend::linear_backward_weight(const View& dy, const View& x, const View& dw, int64_t M,
                                        int64_t in, int64_t out, float beta) {
  check.linear_backward_weight(dy, x, dw, M, in, out, beta);
  check.product_activations("linear_backward_weight", compute(), {{"dy", dy}, {"x", x}});
  if (beta == 0.0f) fill_zero(dw.at(0, out * in));  // then added to: the bits of a GEMM's beta 0
  if (M == 0 || in == 0 || out == 0) return;
  // Under bf16 compute from bf16-rounded inputs; accumulated into dw in fp32
  // as a GEMM with beta = 1 does, rounded once into a bf16 dw.
  const bool bf = compute() == DType::kBF16;
  const float* dyr = bf ? bf16_values(dy.at(0, M * out), kSlotX) : dy.f32();
  const float* xr = bf ? bf16_values(x.at(0, M * in), kSlotW) : x.f32();
  if (dw.dtype == DType::kF32) {
    k::linear_backward_weight(dyr, xr, dw.f32(), M, in, out);
    return;
  }
  // A bf16 dw: the contribution in fp32 (the kernel adds it into zeros), then
  // added with one rounding.
  const int64_t n = out * in;
  float* c = scratch_f32(kSlotOut, n);
  std::memset(c, 0, static_cast<size_t>(n) * sizeof(float));
  k::linear_backward_weight(dyr, xr, c, M, in, out);
  accumulate_gradient(dw.at(0, n), c, n);
}

// ---- RMSNorm -----------------------------------------------------------------------------

void CpuBackend::rmsnorm_forward(const View& x, const View& w, const View& y, const View& inv_rms,
                                 int64_t rows, int64_t dim, float eps) {
  check.rmsnorm("rmsnorm_forward", x, w, y, "y", inv_rms, rows, dim);
  const float* wf = f32_values(w.at(0, dim), kSlotW);
  if (y.dtype == DType::kF32)
    k::rmsnorm_forward(x.f32(), wf, y.f32(), inv_rms.f32(), rows, dim, eps);
  else
    k::rmsnorm_forward(x.f32(), wf, y.bf16(), inv_rms.f32(), rows, dim, eps);
}

void CpuBackend::rmsnorm_apply(const View& x, const View& w, const View& inv_rms, const View& y,
                               int64_t rows, int64_t dim) {
  check.rmsnorm("rmsnorm_apply", x, w, y, "y", inv_rms, rows, dim);
  const float* wf = f32_values(w.at(0, dim), kSlotW);
  if (y.dtype == DType::kF32)
    k::rmsnorm_apply(x.f32(), wf, inv_rms.f32(), y.f32(), rows, dim);
  else
    k::rmsnorm_apply(x.f32(), wf, inv_rms.f32(), y.bf16(), rows, dim);
}

void CpuBackend::rmsnorm_backward(const View& dy, const View& x, const View& w, const View& inv_rms,
                                  const View& dx, const View& dw, int64_t rows, int64_t dim,
                                  const View& dx_bf16, float dw_beta) {
  check.rmsnorm_backward(dy, x, w, inv_rms, dx, dw, rows, dim, dx_bf16, dw_beta);
  if (dw_beta == 0.0f) fill_zero(dw.at(0, dim));
  const float* wf = f32_values(w.at(0, dim), kSlotW);
  // An fp32 dw takes the sums directly; a bf16 one from a scratch, rounded once.
  float* c = dw.dtype == DType::kF32 ? dw.f32() : scratch_f32(kSlotOut, dim);
  if (dw.dtype != DType::kF32) std::memset(c, 0, static_cast<size_t>(dim) * sizeof(float));
  if (dy.dtype == DType::kF32)
    k::rmsnorm_backward(dy.f32(), x.f32(), wf, inv_rms.f32(), dx.f32(), c, rows, dim);
  else
    k::rmsnorm_backward(dy.bf16(), x.f32(), wf, inv_rms.f32(), dx.f32(), c, rows, dim);
  if (dw.dtype != DType::kF32) accumulate_gradient(dw.at(0, dim), c, dim);
  if (!dx_bf16.empty()) round_to_bf16(dx.f32(), dx_bf16.bf16(), rows * dim);
}

// ---- AdamW ----------------------------------------------------------------------------------

namespace {

// Copy = void: no parameter copy. The states are read from p_in, m_in, v_in
// and written to p, m, v (the same memory when in place).
// The step's fields are copied into locals, as engine/optimizer.cpp had them:
// the loop then does not reload them (they could alias p, m, v for all the
// compiler knows), and the per-element arithmetic compiles as the engine's did
// (with -ffp-contract=fast the compiler may fuse multiply-adds, and how it does
// depends on the code around adamw_update_element).
struct AdamWStates {
  const float *p_in, *m_in, *v_in;
  float *p, *m, *v;
};

template <typename Grad, typename Copy>
void adamw_loop(const AdamWStates& x, const Grad* g, Copy* copy, int64_t n, const AdamWStep& s) {
  const float lr = s.lr, b1 = s.beta1, b2 = s.beta2, eps = s.eps, wd = s.weight_decay,
              bc1 = s.bias_correction1, bc2 = s.bias_correction2,
              scale = s.scale.empty() ? s.grad_scale : s.scale.f32()[0];
  const bool scaled = scale != 1.0f;
  const float *p_in = x.p_in, *m_in = x.m_in, *v_in = x.v_in;
  float *p = x.p, *m = x.m, *v = x.v;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float gi = k::load(g[i]);
    if (scaled) gi = gi * scale;
    float pi = p_in[i], mi = m_in[i], vi = v_in[i];
    k::adamw_update_element(pi, mi, vi, gi, lr, b1, b2, eps, wd, bc1, bc2);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if constexpr (!std::is_void_v<Copy>) k::store(copy + i, pi);
  }
}

template <typename Grad>
void adamw_with_grad(const AdamWStates& x, const Grad* g, const View& copy, int64_t n,
                     const AdamWStep& s) {
  if (copy.empty())
    adamw_loop<Grad, void>(x, g, nullptr, n, s);
  else if (copy.dtype == DType::kF32)
    adamw_loop(x, g, copy.f32(), n, s);
  else
    adamw_loop(x, g, copy.bf16(), n, s);
}

}  // namespace

void CpuBackend::adamw(const View& master, const View& m, const View& v, const View& grad,
                       const View& param_copy, const AdamWStep& step) {
  adamw_part(AdamWPart{master, m, v, grad, param_copy, step.weight_decay, {}, {}, {}}, step);
}

void CpuBackend::adamw_parts(const std::vector<AdamWPart>& parts, const AdamWStep& step) {
  AdamWStep s = step;
  for (const AdamWPart& p : parts) {
    s.weight_decay = p.weight_decay;
    adamw_part(p, s);
  }
}

// One part; step.weight_decay is the part's.
void CpuBackend::adamw_part(const AdamWPart& p, const AdamWStep& step) {
  check.adamw_part(p);
  const bool out = p.out_of_place();
  const AdamWStates x{p.master.f32(), p.m.f32(), p.v.f32(), (out ? p.master_out : p.master).f32(),
                      (out ? p.m_out : p.m).f32(), (out ? p.v_out : p.v).f32()};
  const int64_t n = p.master.count;
  if (p.grad.dtype == DType::kF32)
    adamw_with_grad(x, p.grad.f32(), p.param_copy, n, step);
  else
    adamw_with_grad(x, p.grad.bf16(), p.param_copy, n, step);
}

}  // namespace amsp::backend
