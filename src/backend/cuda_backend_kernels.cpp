// The CUDA backend's model kernels: embedding, linear (cuBLAS), RMSNorm, RoPE,
// attention, SwiGLU, cross-entropy and AdamW. cuda_backend.h states the
// semantics; the argument checks are shared with the CPU backend (checks.h).
#include <algorithm>
#include <type_traits>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/checks.h"
#include "backend/cuda_backend.h"
#include "core/error.h"
#include "gpu/check.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"

namespace amsp::backend {

namespace kc = amsp::kernels::cuda;
using bf16_t = uint16_t;

namespace {

constexpr Checks check(Device::kCuda);

// cuBLAS takes int dimensions.
int gemm_dim(const char* kernel, const char* name, int64_t n) {
  if (n > 0x7fffffff) fail(kernel, ": ", name, " = ", n, " exceeds cuBLAS's int dimensions");
  return static_cast<int>(n);
}

const float* f32p(const View& v) { return static_cast<const float*>(v.data); }
float* f32w(const View& v) { return static_cast<float*>(v.data); }
const bf16_t* bf16p(const View& v) { return static_cast<const bf16_t*>(v.data); }
bf16_t* bf16w(const View& v) { return static_cast<bf16_t*>(v.data); }
// Calls f with v's memory as its dtype's pointer (float* or bf16_t*), for
// kernels templated on fp32 and bf16 operands.
template <typename F>
void typed(const View& v, F&& f) {
  if (v.dtype == DType::kF32)
    f(f32w(v));
  else
    f(bf16w(v));
}
const int32_t* i32p(const View& v) { return static_cast<const int32_t*>(v.data); }

}  // namespace

// ---- embedding ---------------------------------------------------------------------

void CudaBackend::embedding_forward(const View& tokens, const View& table, const View& out, int64_t rows,
                                    int64_t dim) {
  const char* kn = "embedding_forward";
  check.embedding(kn, tokens, table, "table", out, "out", rows, dim);
  if (rows == 0 || dim == 0) return;
  reads(tokens.data, rows * 4);
  reads_rows(table, rows * dim * dtype_bytes(table.dtype));
  writes(out.data, rows * dim * 4);
  if (table.dtype == DType::kF32)
    kc::embedding_forward(i32p(tokens), f32p(table), f32w(out), rows, dim, stream_);
  else
    kc::embedding_forward(i32p(tokens), bf16p(table), f32w(out), rows, dim, stream_);
  AMSP_CUDA_CHECK_LAUNCH(kn);
}

void CudaBackend::embedding_backward(const View& tokens, const View& dout, const View& dtable, int64_t rows,
                                     int64_t dim) {
  const char* kn = "embedding_backward";
  const int64_t vocab = check.embedding(kn, tokens, dtable, "dtable", dout, "dout", rows, dim);
  if (rows == 0 || dim == 0) return;
  Scratch ws = scratch(kc::embedding_backward_workspace(rows, vocab) * int64_t{sizeof(int32_t)});
  reads(tokens.data, rows * 4);
  reads(dout.data, rows * dim * 4);
  reads_rows(dtable, rows * dim * dtype_bytes(dtable.dtype));
  writes_rows(dtable, rows * dim * dtype_bytes(dtable.dtype));
  writes(ws.as<int32_t>(), kc::embedding_backward_workspace(rows, vocab) * int64_t{sizeof(int32_t)});
  if (dtable.dtype == DType::kF32)
    kc::embedding_backward(i32p(tokens), f32p(dout), f32w(dtable), rows, dim, vocab, ws.as<int32_t>(), stream_);
  else
    kc::embedding_backward(i32p(tokens), f32p(dout), bf16w(dtable), rows, dim, vocab, ws.as<int32_t>(), stream_);
  AMSP_CUDA_CHECK_LAUNCH(kn);
}

// ---- matrix products ------------------------------------------------------------------

const float* CudaBackend::as_f32(const View& v, Scratch& s) {
  if (v.dtype == DType::kF32) return f32p(v);
  reads(v);
  writes(s.as<float>(), v.count * 4);
  kc::to_f32(bf16p(v), s.as<float>(), v.count, stream_);
  AMSP_CUDA_CHECK_LAUNCH("to_f32");
  return s.as<float>();
}

const bf16_t* CudaBackend::as_bf16(const View& v, Scratch& s) {
  if (v.dtype == DType::kBF16) return bf16p(v);
  reads(v);
  writes(s.as<bf16_t>(), v.count * 2);
  kc::to_bf16(f32p(v), s.as<bf16_t>(), v.count, stream_);
  AMSP_CUDA_CHECK_LAUNCH("to_bf16");
  return s.as<bf16_t>();
}

// C[m, n] = op(A) op(B) + beta C, column-major, as cuBLAS sees the row-major
// matrices; fp32 accumulation through cuBLASLt (cuda_gemm.h), C fp32 or, for
// bf16 operands, bf16: computed in fp32 with beta C, stored once. cuBLASLt
// declares its operands' accesses itself (in the emulation), so the callers do
// not. An empty sum (k = 0) is C = beta C without the library: beta 0 zeroes
// C, beta 1 leaves it or copies C_in into it (the only betas the kernels take).
void CudaBackend::gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* A,
                       bool a_bf16, int64_t lda, const void* B, bool b_bf16, int64_t ldb,
                       float beta, void* C, bool c_bf16, int64_t ldc, const void* C_in) {
  if (C_in == nullptr) C_in = C;
  const char* kn = "gemm";
  const int im = gemm_dim(kn, "m", m), in = gemm_dim(kn, "n", n), ik = gemm_dim(kn, "k", k);
  const int ia = gemm_dim(kn, "lda", lda), ib = gemm_dim(kn, "ldb", ldb), ic = gemm_dim(kn, "ldc", ldc);
  if (a_bf16 != b_bf16 || (c_bf16 && !a_bf16))
    fail(kn, ": operands ", a_bf16 ? "bf16" : "fp32", " and ", b_bf16 ? "bf16" : "fp32", " into ",
         c_bf16 ? "bf16" : "fp32", " (expected both fp32 into fp32, or both bf16)");
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta != 0.0f && beta != 1.0f) fail(kn, ": an empty product (k = 0) with beta ", beta, " (expected 0 or 1)");
    if (ldc != m) fail(kn, ": an empty product (k = 0) into C with ldc ", ldc, " != m ", m);
    const int64_t bytes = m * n * (c_bf16 ? 2 : 4);
    if (beta == 0.0f) {
      writes(C, bytes);
      AMSP_CUDA_CHECK(cudaMemsetAsync(C, 0, static_cast<size_t>(bytes), stream_));
    } else if (C_in != C) {
      reads(C_in, bytes);
      writes(C, bytes);
      AMSP_CUDA_CHECK(
          cudaMemcpyAsync(C, C_in, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream_));
    }
    return;
  }
  gemm_->run(stream_, trans_a, trans_b, im, in, ik, {A, a_bf16, ia}, {B, b_bf16, ib}, beta, C_in, C,
             c_bf16, ic);
}

// dst = dst + contribution, rounded once into dst's dtype.
void CudaBackend::accumulate(const View& dst, const float* c, int64_t n) {
  reads(c, n * 4);
  reads(dst);
  writes(dst);
  if (dst.dtype == DType::kF32)
    kc::add(f32w(dst), c, n, stream_);
  else
    kc::add(bf16w(dst), c, n, stream_);
  AMSP_CUDA_CHECK_LAUNCH("add");
}

// Row-major y[M, n] = a[M, k] op(W) + beta y is column-major y^T = op(W)^T
// a^T + beta y^T: for linear_forward (y = x W^T, W[n, k]) W^T's storage read
// transposed, for linear_backward_input (dx = dy W, W[k, n]) W's read as it
// is; a^T read as it is. One GEMM whose epilogue adds beta y in fp32 and
// stores y in its dtype (rounded once into a bf16 y); under bf16 compute fp32
// operands are rounded into scratch first.
void CudaBackend::linear_product(const View& a, const View& w, const View& y, int64_t M, int64_t k,
                                 int64_t n, bool w_transposed, float beta, const View* y_in) {
  if (M == 0 || n == 0) return;
  const View av = a.at(0, M * k), wv = w.at(0, n * k), yv = y.at(0, M * n);
  const bool bf = compute() == DType::kBF16;
  Scratch sa = scratch(bf && k > 0 && av.dtype == DType::kF32 ? M * k * 2 : 0);
  Scratch sw = scratch(k > 0 && ((bf && wv.dtype == DType::kF32) || (!bf && wv.dtype == DType::kBF16))
                           ? n * k * (bf ? 2 : 4) : 0);
  const void* A = bf ? static_cast<const void*>(as_bf16(wv, sw)) : as_f32(wv, sw);
  const void* B = bf ? static_cast<const void*>(as_bf16(av, sa)) : f32p(av);
  gemm(w_transposed, false, n, M, k, A, bf, w_transposed ? std::max<int64_t>(k, 1) : n, B, bf,
       std::max<int64_t>(k, 1), beta, yv.data, yv.dtype == DType::kBF16, n,
       y_in ? y_in->data : nullptr);
}

void CudaBackend::linear_forward(const View& x, const View& w, const View& y, int64_t M, int64_t in, int64_t out,
                                 float beta) {
  check.linear("linear_forward", M, in, out, x, "x", in, w, y, "y", out);
  check.product_activations("linear_forward", compute(), {{"x", x}, {"y", y}});
  linear_product(x, w, y, M, in, out, true, beta);
}

// One product whose epilogue reads r and writes y (cuBLASLt's C and D): no
// copy of r into y first.
void CudaBackend::linear_forward_residual(const View& x, const View& w, const View& r,
                                          const View& y, int64_t M, int64_t in, int64_t out) {
  check.linear_forward_residual(x, w, r, y, M, in, out);
  check.product_activations("linear_forward", compute(), {{"x", x}, {"y", y}});
  const View rv = r.at(0, M * out);  // y itself (in place), or apart from it
  linear_product(x, w, y, M, in, out, true, 1.0f, &rv);
}

void CudaBackend::linear_backward_input(const View& dy, const View& w, const View& dx, int64_t M, int64_t in,
                                        int64_t out, float beta) {
  check.linear("linear_backward_input", M, in, out, dy, "dy", out, w, dx, "dx", in);
  check.product_activations("linear_backward_input", compute(), {{"dy", dy}, {"dx", dx}});
  linear_product(dy, w, dx, M, out, in, false, beta);
}

// dw[out, in] = dy^T x + beta dw is column-major dw^T = x^T dy + beta dw^T.
void CudaBackend::linear_backward_weight(const View& dy, const View& x, const View& dw, int64_t M,
                                         int64_t in, int64_t out, float beta) {
  check.linear_backward_weight(dy, x, dw, M, in, out, beta);
  check.product_activations("linear_backward_weight", compute(), {{"dy", dy}, {"x", x}});
  if (in == 0 || out == 0) return;  // M = 0: gemm's empty sum (k = 0) zeroes dw for beta 0
  const View dyv = dy.at(0, M * out), xv = x.at(0, M * in), dwv = dw.at(0, out * in);
  const int64_t n = out * in;
  const bool bf = compute() == DType::kBF16;
  if (bf) {
    // From bf16-rounded inputs, accumulated into dw by the product itself
    // (beta = 1) in fp32 and rounded once into dw's dtype, or written (beta 0).
    Scratch sx = scratch(xv.dtype == DType::kF32 ? M * in * 2 : 0);
    Scratch sdy = scratch(dyv.dtype == DType::kF32 ? M * out * 2 : 0);
    gemm(false, true, in, out, M, as_bf16(xv, sx), true, in, as_bf16(dyv, sdy), true, out, beta,
         dwv.data, dwv.dtype == DType::kBF16, in);
    return;
  }
  if (dwv.dtype == DType::kF32) {
    gemm(false, true, in, out, M, f32p(xv), false, in, f32p(dyv), false, out, beta, dwv.data, false,
         in);
    return;
  }
  if (beta == 0.0f) fill_zero(dwv);
  // fp32 products into a bf16 gradient: the contribution in fp32 scratch, then
  // added into dw with one rounding per element.
  Scratch sc = scratch(n * 4);
  gemm(false, true, in, out, M, f32p(xv), false, in, f32p(dyv), false, out, 0.0f, sc.as<float>(), false, in);
  accumulate(dwv, sc.as<float>(), n);
}

// ---- RMSNorm -----------------------------------------------------------------------------

void CudaBackend::rmsnorm_forward(const View& x, const View& w, const View& y, const View& inv_rms, int64_t rows,
                                  int64_t dim, float eps) {
  const char* kn = "rmsnorm_forward";
  check.rmsnorm(kn, x, w, y, "y", inv_rms, rows, dim);
  if (rows == 0 || dim == 0) return;
  reads(x.data, rows * dim * 4);
  reads(w.data, dim * dtype_bytes(w.dtype));
  writes(y.data, rows * dim * dtype_bytes(y.dtype));
  writes(inv_rms.data, rows * 4);
  typed(w, [&](auto* wp) {
    typed(y, [&](auto* yp) { kc::rmsnorm_forward(f32p(x), wp, yp, f32w(inv_rms), rows, dim, eps, stream_); });
  });
  AMSP_CUDA_CHECK_LAUNCH(kn);
}

void CudaBackend::rmsnorm_apply(const View& x, const View& w, const View& inv_rms, const View& y, int64_t rows,
                                int64_t dim) {
  const char* kn = "rmsnorm_apply";
  check.rmsnorm(kn, x, w, y, "y", inv_rms, rows, dim);
  if (rows == 0 || dim == 0) return;
  reads(x.data, rows * dim * 4);
  reads(w.data, dim * dtype_bytes(w.dtype));
  reads(inv_rms.data, rows * 4);
  writes(y.data, rows * dim * dtype_bytes(y.dtype));
  typed(w, [&](auto* wp) {
    typed(y, [&](auto* yp) { kc::rmsnorm_apply(f32p(x), wp, f32p(inv_rms), yp, rows, dim, stream_); });
  });
  AMSP_CUDA_CHECK_LAUNCH(kn);
}

void CudaBackend::rmsnorm_backward(const View& dy, const View& x, const View& w,
                                   const View& inv_rms, const View& dx, const View& dw,
                                   int64_t rows, int64_t dim, const View& dx_bf16, float dw_beta) {
  const char* kn = "rmsnorm_backward";
  check.rmsnorm_backward(dy, x, w, inv_rms, dx, dw, rows, dim, dx_bf16, dw_beta);
  if (dim == 0) return;  // no rows: the kernels write dw's empty sums for dw_beta 0
  const int64_t n = rows * dim * 4, wb = dim * dtype_bytes(w.dtype), dwb = dim * dtype_bytes(dw.dtype);
  reads(dy.data, rows * dim * dtype_bytes(dy.dtype));
  reads(x.data, n);
  reads(w.data, wb);
  reads(inv_rms.data, rows * 4);
  reads(dx.data, n);
  writes(dx.data, n);
  bf16_t* dx16 = dx_bf16.empty() ? nullptr : bf16w(dx_bf16);
  if (dx16) writes(dx16, rows * dim * 2);
  if (dw_beta != 0.0f) reads(dw.data, dwb);
  writes(dw.data, dwb);
  const int64_t wsb = kc::rmsnorm_backward_workspace(rows, dim) * int64_t{sizeof(double)};
  Scratch ws = scratch(wsb);
  writes(ws.as<double>(), wsb);
  reads(ws.as<double>(), wsb);
  typed(dy, [&](auto* dyp) {
    typed(w, [&](auto* wp) {
      typed(dw, [&](auto* dwp) {
        kc::rmsnorm_backward(dyp, f32p(x), wp, f32p(inv_rms), f32w(dx), dx16, dwp, dw_beta != 0.0f,
                             rows, dim, ws.as<double>(), stream_);
      });
    });
  });
  AMSP_CUDA_CHECK_LAUNCH(kn);
}

// ---- RoPE -------------------------------------------------------------------------------------

// On the host with the CPU kernel, so both backends rotate by the same angles.
void CudaBackend::rope_table(const View& cos, const View& sin, int64_t max_T, int64_t head_dim, double theta) {
  const int64_t n = check.rope_table(cos, sin, max_T, head_dim);
  std::vector<float> c(static_cast<size_t>(n)), s(static_cast<size_t>(n));
  kernels::rope_table(c.data(), s.data(), max_T, head_dim, theta);
  from_host(c.data(), cos.at(0, n));
  from_host(s.data(), sin.at(0, n));
}

void CudaBackend::rope_forward(const View& x, const View& cos, const View& sin, int64_t B, int64_t T,
                               int64_t heads, int64_t head_dim, int64_t row_stride) {
  rope("rope_forward", x, cos, sin, B, T, heads, head_dim, row_stride, false);
}

void CudaBackend::rope_backward(const View& dx, const View& cos, const View& sin, int64_t B, int64_t T,
                                int64_t heads, int64_t head_dim, int64_t row_stride) {
  rope("rope_backward", dx, cos, sin, B, T, heads, head_dim, row_stride, true);
}

void CudaBackend::rope(const char* kn, const View& x, const View& cos, const View& sin, int64_t B, int64_t T,
                       int64_t heads, int64_t head_dim, int64_t row_stride, bool backward) {
  check.rope(kn, x, cos, sin, B, T, heads, head_dim, row_stride);
  if (B * T == 0 || heads * head_dim == 0) return;
  const int64_t tb = T * head_dim / 2 * 4, heads_bytes = B * T * heads * head_dim * dtype_bytes(x.dtype);
  reads(cos.data, tb);
  reads(sin.data, tb);
  // The heads of each row, rows row_stride apart (q or k in the fused projection):
  // the whole span is ordered, the heads' bytes counted.
  const View span = x.at(0, (B * T - 1) * row_stride + heads * head_dim);
  reads_rows(span, heads_bytes);
  writes_rows(span, heads_bytes);
  typed(x, [&](auto* values) {
    if (backward)
      kc::rope_backward(values, f32p(cos), f32p(sin), B, T, heads, head_dim, row_stride, stream_);
    else
      kc::rope_forward(values, f32p(cos), f32p(sin), B, T, heads, head_dim, row_stride, stream_);
  });
  AMSP_CUDA_CHECK_LAUNCH(kn);
}

// ---- attention ----------------------------------------------------------------------------------

int64_t CudaBackend::attention_saved_count(int64_t B, int64_t T, int64_t H) const {
  Checks::product("attention_saved_count", {B, H, T});
  return kc::attention_saved_count(B, T, H);
}

void CudaBackend::reads_rope(const RopeTables& rope, int64_t T, int64_t D, const char* file,
                             int line) {
  if (rope.cos.empty()) return;
  reads(rope.cos.data, T * (D / 2) * 4, file, line);
  reads(rope.sin.data, T * (D / 2) * 4, file, line);
}

void CudaBackend::attention_forward(const View& qkv, const View& saved, const View& out, int64_t B,
                                    int64_t T, int64_t H, int64_t KV, int64_t D) {
  const char* kn = "attention_forward";
  check.attention_forward(*this, qkv, saved, out, B, T, H, KV, D);
  const int64_t e = dtype_bytes(qkv.dtype), ld = (H + 2 * KV) * D;
  const int64_t nqkv = B * T * ld, nq = B * T * H * D, ns = attention_saved_count(B, T, H);
  if (B * T == 0) return;
  reads(qkv.data, nqkv * e);
  writes(saved.data, ns * 4);
  writes(out.data, nq * e);
  typed(qkv, [&](auto* q) {
    using A = std::remove_const_t<std::remove_pointer_t<decltype(q)>>;
    kc::attention_forward<A>(q, q + H * D, q + (H + KV) * D, ld, ld, f32w(saved),
                             static_cast<A*>(out.data), B, T, H, KV, D, compute() == DType::kBF16,
                             stream_);
  });
  AMSP_CUDA_CHECK_LAUNCH(kn);
}

void CudaBackend::attention_backward(const View& qkv, const RopeTables& rope, const View& saved,
                                     const View& out, const View& dout, const View& dqkv, int64_t B,
                                     int64_t T, int64_t H, int64_t KV, int64_t D) {
  const char* kn = "attention_backward";
  check.attention_backward(*this, qkv, rope, saved, &out, dout, dqkv, B, T, H, KV, D);
  const int64_t e = dtype_bytes(qkv.dtype), ld = (H + 2 * KV) * D;
  const int64_t nqkv = B * T * ld, nq = B * T * H * D, ns = attention_saved_count(B, T, H);
  if (B * T == 0) return;
  const bool bf16 = compute() == DType::kBF16;
  const int64_t nw = kc::attention_backward_workspace(B, T, H, KV, D, bf16);
  Scratch ws = scratch(nw * 4);
  reads(qkv.data, nqkv * e);
  reads_rope(rope, T, D);
  for (const View* in : {&out, &dout}) reads(in->data, nq * e);
  reads(saved.data, ns * 4);
  writes(ws.as<float>(), nw * 4);
  reads(ws.as<float>(), nw * 4);
  writes(dqkv.data, nqkv * e);
  const int64_t k_at = H * D, v_at = (H + KV) * D;
  typed(qkv, [&](auto* q) {
    using A = std::remove_const_t<std::remove_pointer_t<decltype(q)>>;
    A* dq = static_cast<A*>(dqkv.data);
    kc::attention_backward<A>(q, q + k_at, q + v_at, ld, ld, rope.rotary(), f32p(saved),
                              static_cast<const A*>(out.data), static_cast<const A*>(dout.data), dq,
                              dq + k_at, dq + v_at, ws.as<float>(), B, T, H, KV, D, bf16, stream_);
  });
  AMSP_CUDA_CHECK_LAUNCH(kn);
}

// ---- SwiGLU -------------------------------------------------------------------------------------

void CudaBackend::swiglu_forward(const View& gate_up, const View& out, int64_t rows, int64_t I) {
  const char* kn = "swiglu_forward";
  check.swiglu_forward(gate_up, out, rows, I);
  if (rows * I == 0) return;
  const int64_t e = dtype_bytes(gate_up.dtype);
  reads(gate_up.data, rows * 2 * I * e);
  writes(out.data, rows * I * e);
  typed(gate_up, [&](auto* g) {
    using A = std::remove_pointer_t<decltype(g)>;
    kc::swiglu_forward<A>(g, g + I, 2 * I, static_cast<A*>(out.data), rows, I, stream_);
  });
  AMSP_CUDA_CHECK_LAUNCH(kn);
}

void CudaBackend::swiglu_backward(const View& gate_up, const View& dout, const View& dgate_up,
                                  int64_t rows, int64_t I) {
  const char* kn = "swiglu_backward";
  check.swiglu_backward(gate_up, dout, dgate_up, rows, I);
  if (rows * I == 0) return;
  const int64_t e = dtype_bytes(gate_up.dtype);
  reads(gate_up.data, rows * 2 * I * e);
  reads(dout.data, rows * I * e);
  writes(dgate_up.data, rows * 2 * I * e);
  typed(gate_up, [&](auto* g) {
    using A = std::remove_pointer_t<decltype(g)>;
    A* d = static_cast<A*>(dgate_up.data);
    kc::swiglu_backward<A>(g, g + I, 2 * I, static_cast<const A*>(dout.data), d, d + I, rows, I, stream_);
  });
  AMSP_CUDA_CHECK_LAUNCH(kn);
}

// ---- cross-entropy ------------------------------------------------------------------------------

// The per-row losses, the targets and the bad-row flag come back in one
// download; the sum is taken on the host in double, in row order.
LossSum CudaBackend::cross_entropy_forward(const View& logits, const View& targets, const View& lse, int64_t rows,
                                           int64_t V) {
  const char* kn = "cross_entropy_forward";
  check.cross_entropy(kn, logits, targets, lse, rows, V);
  if (rows == 0) return {};
  // [losses: rows floats][targets: rows int32][bad_row: one int32]
  const int64_t bytes = rows * 8 + 4;
  Scratch back = scratch(bytes);
  void* host_flag = staging(bytes);  // grown now: download() below must not reallocate it
  char* base = back.as<char>();
  float* losses = reinterpret_cast<float*>(base);
  int32_t* tgt = reinterpret_cast<int32_t*>(base + rows * 4);
  int32_t* bad = reinterpret_cast<int32_t*>(base + rows * 8);
  const int32_t none = std::numeric_limits<int32_t>::max();
  std::memcpy(host_flag, &none, 4);
  AMSP_CUDA_CHECK(cudaMemcpyAsync(bad, host_flag, 4, cudaMemcpyHostToDevice, stream_));
  reads(logits.data, rows * V * dtype_bytes(logits.dtype));
  reads(targets.data, rows * 4);
  writes(lse.data, rows * 4);
  writes(losses, rows * 4);
  typed(logits, [&](auto* z) { kc::cross_entropy_forward(z, i32p(targets), f32w(lse), losses, bad, rows, V, stream_); });
  AMSP_CUDA_CHECK_LAUNCH(kn);
  AMSP_CUDA_CHECK(cudaMemcpyAsync(tgt, targets.data, static_cast<size_t>(rows) * 4, cudaMemcpyDeviceToDevice,
                                  stream_));
  const char* host = static_cast<const char*>(download(base, bytes));
  const float* h_loss = reinterpret_cast<const float*>(host);
  const int32_t* h_tgt = reinterpret_cast<const int32_t*>(host + rows * 4);
  int32_t h_bad = 0;
  std::memcpy(&h_bad, host + rows * 8, 4);
  if (h_bad != none)
    fail(kn, ": target ", h_tgt[h_bad], " at row ", h_bad, " is outside the vocabulary of ", V);
  LossSum loss;
  for (int64_t r = 0; r < rows; ++r) {
    if (h_tgt[r] < 0) continue;
    loss.sum += static_cast<double>(h_loss[r]);
    ++loss.count;
  }
  return loss;
}

// The losses stay on the device: summed by one block in a fixed order into acc,
// with the first bad row, read back when the caller next synchronises.
void CudaBackend::cross_entropy_forward_into(const View& logits, const View& targets, const View& lse,
                                             int64_t rows, int64_t V, const View& acc) {
  const char* kn = "cross_entropy_forward_into";
  check.cross_entropy(kn, logits, targets, lse, rows, V);
  check.expect(kn, "acc", acc, DType::kF64);
  if (rows == 0) return;
  Scratch back = scratch(rows * 4 + 4);  // [losses: rows floats][bad_row: one int32]
  float* losses = back.as<float>();
  int32_t* bad = reinterpret_cast<int32_t*>(back.as<char>() + rows * 4);
  writes(bad, 4);
  kc::fill_i32(bad, std::numeric_limits<int32_t>::max(), 1, stream_);
  reads(logits.data, rows * V * dtype_bytes(logits.dtype));
  reads(targets.data, rows * 4);
  writes(lse.data, rows * 4);
  writes(losses, rows * 4);
  typed(logits, [&](auto* z) { kc::cross_entropy_forward(z, i32p(targets), f32w(lse), losses, bad, rows, V, stream_); });
  reads(losses, rows * 4);
  reads(bad, 4);
  reads(targets.data, rows * 4);
  reads(acc);
  writes(acc);
  kc::accumulate_loss(losses, i32p(targets), bad, rows, static_cast<double*>(acc.data), stream_);
  AMSP_CUDA_CHECK_LAUNCH(kn);
}

void CudaBackend::cross_entropy_backward(const View& logits, const View& targets, const View& lse, int64_t rows,
                                         int64_t V, float scale) {
  const char* kn = "cross_entropy_backward";
  check.cross_entropy(kn, logits, targets, lse, rows, V);
  if (rows == 0) return;
  reads(targets.data, rows * 4);
  reads(lse.data, rows * 4);
  reads(logits.data, rows * V * dtype_bytes(logits.dtype));
  writes(logits.data, rows * V * dtype_bytes(logits.dtype));
  typed(logits, [&](auto* z) { kc::cross_entropy_backward(z, i32p(targets), f32p(lse), rows, V, scale, stream_); });
  AMSP_CUDA_CHECK_LAUNCH(kn);
}

// ---- AdamW --------------------------------------------------------------------------------------

void CudaBackend::adamw(const View& master, const View& m, const View& v, const View& grad, const View& param_copy,
                        const AdamWStep& s) {
  adamw_parts({AdamWPart{master, m, v, grad, param_copy, s.weight_decay, {}, {}, {}}}, s);
}

// Every part in as few launches as the kernel takes (kc::kAdamWTensors each).
void CudaBackend::adamw_parts(const std::vector<AdamWPart>& parts, const AdamWStep& s) {
  const char* kn = "adamw";
  std::vector<kc::AdamWTensor> tensors;
  for (const AdamWPart& p : parts) {
    check.adamw_part(p);
    if (p.master.count == 0) continue;
    const bool out = p.out_of_place();
    const View& master = out ? p.master_out : p.master;
    const View& m = out ? p.m_out : p.m;
    const View& v = out ? p.v_out : p.v;
    for (const View* x : {&p.master, &p.m, &p.v}) reads(*x);
    for (const View* x : {&master, &m, &v}) writes(*x);
    reads(p.grad);
    if (!p.param_copy.empty()) writes(p.param_copy);
    tensors.push_back({f32p(p.master), f32p(p.m), f32p(p.v), f32w(master), f32w(m), f32w(v), p.grad.data,
                       p.param_copy.empty() ? nullptr : p.param_copy.data, p.master.count,
                       p.grad.dtype == DType::kBF16, p.param_copy.dtype == DType::kBF16, p.weight_decay});
  }
  if (tensors.empty()) return;
  if (!s.scale.empty()) {
    check.expect(kn, "scale", s.scale, DType::kF32);
    reads(s.scale);
  }
  const kc::AdamWHyper h{s.lr, s.beta1, s.beta2, s.eps, s.bias_correction1, s.bias_correction2, s.grad_scale,
                         s.scale.empty() ? nullptr : f32p(s.scale)};
  kc::adamw(tensors.data(), static_cast<int>(tensors.size()), h, stream_);
  AMSP_CUDA_CHECK_LAUNCH(kn);
}

}  // namespace amsp::backend
