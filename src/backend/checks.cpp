// The backends' argument checks: checks.h.
#include "backend/checks.h"

#include "backend/backend.h"
#include "core/error.h"

namespace amsp::backend {

// ---- sizes ----------------------------------------------------------------------------

void Checks::sizes(const char* kernel, std::initializer_list<std::pair<const char*, int64_t>> sizes) {
  for (const auto& [name, value] : sizes)
    if (value < 0) fail(kernel, ": ", name, " = ", value, " is negative");
}

int64_t Checks::product(const char* kernel, std::initializer_list<int64_t> sizes) {
  int64_t p = 1;
  for (int64_t s : sizes)
    if (__builtin_mul_overflow(p, s, &p)) fail(kernel, ": sizes overflow 64 bits");
  return p;
}

void Checks::need(const char* kernel, const char* name, const View& v, int64_t n) {
  if (v.count < n) fail(kernel, ": ", name, " holds ", v.count, " elements, needs ", n);
}

// ---- views ----------------------------------------------------------------------------

void Checks::device(const char* kernel, const char* name, const View& v) const {
  if (v.device == device_ || (device_ != Device::kCpu && v.count == 0)) return;
  fail(kernel, ": ", name, " is ", device_name(v.device), " memory; the ", device_name(device_),
       " backend reads ", device_ == Device::kCpu ? "host" : "device", " memory only");
}

void Checks::expect(const char* kernel, const char* name, const View& v, DType t) const {
  device(kernel, name, v);
  if (v.dtype != t)
    fail(kernel, ": ", name, " is ", dtype_name(v.dtype), ", expected ", dtype_name(t));
}

void Checks::expect_all(const char* kernel, DType t, std::initializer_list<Arg> args) const {
  for (const Arg& a : args) expect(kernel, a.name, a.view, t);
}

void Checks::expect_float(const char* kernel, const char* name, const View& v) const {
  device(kernel, name, v);
  if (v.dtype != DType::kF32 && v.dtype != DType::kBF16)
    fail(kernel, ": ", name, " is ", dtype_name(v.dtype), ", expected fp32 or bf16");
}

void Checks::expect_activations(const char* kernel, std::initializer_list<Arg> args) const {
  const Arg& first = *args.begin();
  expect_float(kernel, first.name, first.view);
  for (const Arg& a : args) {
    device(kernel, a.name, a.view);
    if (a.view.dtype != first.view.dtype)
      fail(kernel, ": ", a.name, " is ", dtype_name(a.view.dtype), ", expected ", dtype_name(first.view.dtype),
           " as ", first.name, " is");
  }
}

void Checks::product_activations(const char* kernel, DType compute, std::initializer_list<Arg> args) const {
  if (compute != DType::kF32) return;
  for (const Arg& a : args)
    if (a.view.dtype != DType::kF32)
      fail(kernel, ": ", a.name, " is ", dtype_name(a.view.dtype), ", expected fp32 (bf16 activations need bf16 compute)");
}

// ---- the backend ----------------------------------------------------------------------

void Checks::compute(DType dtype) const {
  if (dtype != DType::kF32 && dtype != DType::kBF16)
    fail(device_name(device_), " backend: compute dtype ", dtype_name(dtype), " is not fp32 or bf16");
}

int64_t Checks::alloc_bytes(DType dtype, int64_t count) {
  if (count < 0) fail("alloc: count ", count, " is negative");
  return product("alloc", {count, dtype_bytes(dtype)});
}

void Checks::event(int64_t id, int64_t last) {
  if (id > last) fail("wait: event ", id, " was not recorded by this backend (last: ", last, ")");
}

// ---- elementwise ----------------------------------------------------------------------

void Checks::copy(const View& src, const View& dst) const {
  device("copy", "src", src);
  device("copy", "dst", dst);
  if (src.count != dst.count) fail("copy: src holds ", src.count, " elements, dst ", dst.count);
}

void Checks::add(const View& dst, const View& src) const {
  expect_float("add", "dst", dst);
  expect_float("add", "src", src);
  if (src.count != dst.count) fail("add: dst holds ", dst.count, " elements, src ", src.count);
}

// ---- embedding and linear -------------------------------------------------------------

int64_t Checks::embedding(const char* kn, const View& tokens, const View& table, const char* table_name,
                          const View& rows_view, const char* rows_name, int64_t rows, int64_t dim) const {
  sizes(kn, {{"rows", rows}, {"dim", dim}});
  expect(kn, "tokens", tokens, DType::kI32);
  expect_float(kn, table_name, table);
  expect(kn, rows_name, rows_view, DType::kF32);
  need(kn, "tokens", tokens, rows);
  need(kn, rows_name, rows_view, product(kn, {rows, dim}));
  return dim == 0 ? 0 : table.count / dim;
}

void Checks::linear(const char* kn, int64_t M, int64_t in, int64_t out, const View& a, const char* a_name,
                    int64_t a_cols, const View& w, const View& y, const char* y_name, int64_t y_cols) const {
  sizes(kn, {{"M", M}, {"in", in}, {"out", out}});
  expect_float(kn, y_name, y);
  const int64_t na = product(kn, {M, a_cols}), nw = product(kn, {out, in}), ny = product(kn, {M, y_cols});
  expect_float(kn, a_name, a);
  expect_float(kn, "w", w);
  need(kn, a_name, a, na);
  need(kn, "w", w, nw);
  need(kn, y_name, y, ny);
}

void Checks::linear_forward_residual(const View& x, const View& w, const View& r, const View& y,
                                     int64_t M, int64_t in, int64_t out) const {
  const char* kn = "linear_forward_residual";
  linear(kn, M, in, out, x, "x", in, w, y, "y", out);
  expect(kn, "r", r, DType::kF32);
  expect(kn, "y", y, DType::kF32);
  const int64_t n = M * out;
  need(kn, "r", r, n);
  const auto* r0 = static_cast<const char*>(r.data);
  const auto* y0 = static_cast<const char*>(y.data);
  if (r0 != y0 && r0 < y0 + n * 4 && y0 < r0 + n * 4)
    fail(kn,
         ": r and y overlap without being the same matrix (expected one matrix, or disjoint ones)");
}

namespace {

// A gradient's beta: written (0) or added to (1), nothing else.
void check_gradient_beta(const char* kernel, const char* name, float beta) {
  if (beta != 0.0f && beta != 1.0f)
    fail(kernel, ": ", name, " = ", beta, " (expected 0, the gradient written, or 1, added to)");
}

}  // namespace

void Checks::linear_backward_weight(const View& dy, const View& x, const View& dw, int64_t M,
                                    int64_t in, int64_t out, float beta) const {
  const char* kn = "linear_backward_weight";
  sizes(kn, {{"M", M}, {"in", in}, {"out", out}});
  check_gradient_beta(kn, "beta", beta);
  expect_float(kn, "dy", dy);
  expect_float(kn, "x", x);
  expect_float(kn, "dw", dw);
  need(kn, "dy", dy, product(kn, {M, out}));
  need(kn, "x", x, product(kn, {M, in}));
  need(kn, "dw", dw, product(kn, {out, in}));
}

// ---- RMSNorm and RoPE -----------------------------------------------------------------

void Checks::rmsnorm(const char* kn, const View& x, const View& w, const View& y, const char* y_name,
                     const View& inv_rms, int64_t rows, int64_t dim) const {
  sizes(kn, {{"rows", rows}, {"dim", dim}});
  expect(kn, "x", x, DType::kF32);
  expect_float(kn, "w", w);
  expect_float(kn, y_name, y);
  expect(kn, "inv_rms", inv_rms, DType::kF32);
  const int64_t n = product(kn, {rows, dim});
  need(kn, "x", x, n);
  need(kn, "w", w, dim);
  need(kn, y_name, y, n);
  need(kn, "inv_rms", inv_rms, rows);
}

void Checks::rmsnorm_backward(const View& dy, const View& x, const View& w, const View& inv_rms,
                              const View& dx, const View& dw, int64_t rows, int64_t dim,
                              const View& dx_bf16, float dw_beta) const {
  const char* kn = "rmsnorm_backward";
  check_gradient_beta(kn, "dw_beta", dw_beta);
  expect(kn, "dx", dx, DType::kF32);  // the residual stream's gradient accumulates in fp32
  rmsnorm(kn, x, w, dx, "dx", inv_rms, rows, dim);
  expect_float(kn, "dy", dy);
  expect_float(kn, "dw", dw);
  need(kn, "dy", dy, rows * dim);
  need(kn, "dw", dw, dim);
  if (dx_bf16.empty()) return;
  expect(kn, "dx_bf16", dx_bf16, DType::kBF16);
  need(kn, "dx_bf16", dx_bf16, rows * dim);
}

namespace {

void check_head_dim(const char* kernel, int64_t head_dim) {
  if (head_dim % 2 != 0) fail(kernel, ": head_dim ", head_dim, " is odd");
}

}  // namespace

int64_t Checks::rope_table(const View& cos, const View& sin, int64_t max_T, int64_t head_dim) const {
  const char* kn = "rope_table";
  sizes(kn, {{"max_T", max_T}, {"head_dim", head_dim}});
  check_head_dim(kn, head_dim);
  expect(kn, "cos", cos, DType::kF32);
  expect(kn, "sin", sin, DType::kF32);
  const int64_t n = product(kn, {max_T, head_dim / 2});
  need(kn, "cos", cos, n);
  need(kn, "sin", sin, n);
  return n;
}

void Checks::rope(const char* kn, const View& x, const View& cos, const View& sin, int64_t B, int64_t T,
                  int64_t heads, int64_t head_dim, int64_t row_stride) const {
  sizes(kn, {{"B", B}, {"T", T}, {"heads", heads}, {"head_dim", head_dim}, {"row_stride", row_stride}});
  check_head_dim(kn, head_dim);
  expect_float(kn, "x", x);
  expect(kn, "cos", cos, DType::kF32);
  expect(kn, "sin", sin, DType::kF32);
  const int64_t width = product(kn, {heads, head_dim}), rows = product(kn, {B, T});
  if (width > row_stride) fail(kn, ": ", heads, " heads of ", head_dim, " do not fit in rows of ", row_stride);
  need(kn, "cos", cos, product(kn, {T, head_dim / 2}));
  need(kn, "sin", sin, product(kn, {T, head_dim / 2}));
  if (rows > 0) need(kn, "x", x, product(kn, {rows - 1, row_stride}) + width);
}

// ---- attention ------------------------------------------------------------------------

namespace {

void check_attention_shape(const char* kn, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
  Checks::sizes(kn, {{"B", B}, {"T", T}});
  if (H <= 0 || KV <= 0 || D <= 0) fail(kn, ": H = ", H, ", KV = ", KV, " and D = ", D, " must be positive");
  if (H % KV != 0) fail(kn, ": ", H, " query heads do not share ", KV, " kv heads evenly");
}

void check_attention_rope(const Checks& c, const char* kn, const RopeTables& rope, int64_t T,
                          int64_t D) {
  if (rope.cos.empty() && rope.sin.empty()) return;
  check_head_dim(kn, D);
  c.expect_all(kn, DType::kF32, {{"rope cos", rope.cos}, {"rope sin", rope.sin}});
  const int64_t n = Checks::product(kn, {T, D / 2});
  Checks::need(kn, "rope cos", rope.cos, n);
  Checks::need(kn, "rope sin", rope.sin, n);
}

}  // namespace

void Checks::attention_forward(const Backend& backend, const View& qkv, const View& saved,
                               const View& out, int64_t B, int64_t T, int64_t H, int64_t KV,
                               int64_t D) const {
  const char* kn = "attention_forward";
  check_attention_shape(kn, B, T, H, KV, D);
  expect_activations(kn, {{"qkv", qkv}, {"out", out}});
  expect(kn, "saved", saved, DType::kF32);
  need(kn, "qkv", qkv, product(kn, {B, T, H + 2 * KV, D}));
  need(kn, "saved", saved, backend.attention_saved_count(B, T, H));
  need(kn, "out", out, product(kn, {B, T, H, D}));
}

void Checks::attention_backward(const Backend& backend, const View& qkv, const RopeTables& rope,
                                const View& saved, const View* out, const View& dout,
                                const View& dqkv, int64_t B, int64_t T, int64_t H, int64_t KV,
                                int64_t D) const {
  const char* kn = "attention_backward";
  check_attention_shape(kn, B, T, H, KV, D);
  check_attention_rope(*this, kn, rope, T, D);
  expect_activations(kn, {{"qkv", qkv}, {"dout", dout}, {"dqkv", dqkv}});
  if (out) expect_activations(kn, {{"qkv", qkv}, {"out", *out}});
  expect(kn, "saved", saved, DType::kF32);
  const int64_t nqkv = product(kn, {B, T, H + 2 * KV, D}), nq = product(kn, {B, T, H, D});
  need(kn, "qkv", qkv, nqkv);
  need(kn, "saved", saved, backend.attention_saved_count(B, T, H));
  if (out) need(kn, "out", *out, nq);
  need(kn, "dout", dout, nq);
  need(kn, "dqkv", dqkv, nqkv);
}

// ---- SwiGLU, cross-entropy and AdamW --------------------------------------------------

void Checks::swiglu_forward(const View& gate_up, const View& out, int64_t rows, int64_t I) const {
  const char* kn = "swiglu_forward";
  sizes(kn, {{"rows", rows}, {"I", I}});
  expect_activations(kn, {{"gate_up", gate_up}, {"out", out}});
  need(kn, "gate_up", gate_up, product(kn, {rows, 2, I}));
  need(kn, "out", out, product(kn, {rows, I}));
}

void Checks::swiglu_backward(const View& gate_up, const View& dout, const View& dgate_up,
                             int64_t rows, int64_t I) const {
  const char* kn = "swiglu_backward";
  sizes(kn, {{"rows", rows}, {"I", I}});
  expect_activations(kn, {{"gate_up", gate_up}, {"dout", dout}, {"dgate_up", dgate_up}});
  need(kn, "gate_up", gate_up, product(kn, {rows, 2, I}));
  need(kn, "dout", dout, product(kn, {rows, I}));
  need(kn, "dgate_up", dgate_up, product(kn, {rows, 2, I}));
}

void Checks::cross_entropy(const char* kn, const View& logits, const View& targets, const View& lse,
                           int64_t rows, int64_t V) const {
  sizes(kn, {{"rows", rows}});
  if (V <= 0) fail(kn, ": vocabulary size ", V, " must be positive");
  expect_float(kn, "logits", logits);
  expect(kn, "targets", targets, DType::kI32);
  expect(kn, "lse", lse, DType::kF32);
  need(kn, "logits", logits, product(kn, {rows, V}));
  need(kn, "targets", targets, rows);
  need(kn, "lse", lse, rows);
}

void Checks::adamw(const View& master, const View& m, const View& v, const View& grad,
                   const View& param_copy) const {
  const char* kn = "adamw";
  expect_all(kn, DType::kF32, {{"master", master}, {"m", m}, {"v", v}});
  expect_float(kn, "grad", grad);
  if (!param_copy.empty()) expect_float(kn, "param_copy", param_copy);
  const int64_t n = master.count;
  for (const Arg& a : {Arg{"m", m}, Arg{"v", v}, Arg{"grad", grad}})
    if (a.view.count != n) fail(kn, ": ", a.name, " holds ", a.view.count, " elements, master ", n);
  if (!param_copy.empty() && param_copy.count != n)
    fail(kn, ": param_copy holds ", param_copy.count, " elements, master ", n);
}

void Checks::adamw_part(const AdamWPart& p) const {
  const char* kn = "adamw";
  adamw(p.master, p.m, p.v, p.grad, p.param_copy);
  if (!p.out_of_place()) return;
  if (p.master_out.empty() || p.m_out.empty() || p.v_out.empty())
    fail(kn, ": an out-of-place part needs master_out, m_out and v_out, all three");
  expect_all(kn, DType::kF32, {{"master_out", p.master_out}, {"m_out", p.m_out}, {"v_out", p.v_out}});
  for (const Arg& a : {Arg{"master_out", p.master_out}, Arg{"m_out", p.m_out}, Arg{"v_out", p.v_out}})
    if (a.view.count != p.master.count)
      fail(kn, ": ", a.name, " holds ", a.view.count, " elements, master ", p.master.count);
}

// ---- compression ----------------------------------------------------------------------

int64_t Checks::quant(const char* kn, const kernels::quant::Spec& spec, int64_t n, int64_t records,
                      const View& values, const char* values_name, int64_t chunks,
                      const View& records_view, const char* records_name) const {
  if (spec.bits != 8 && spec.bits != 4) fail(kn, ": bits = ", spec.bits, ", expected 8 or 4");
  if (spec.block <= 0) fail(kn, ": block = ", spec.block, ", expected a positive number of values");
  sizes(kn, {{"n", n}, {"records", records}});
  expect_float(kn, values_name, values);
  expect(kn, records_name, records_view, DType::kI32);
  need(kn, values_name, values, product(kn, {chunks, n}));
  const int64_t words = kernels::quant::record_words(n, spec);
  const int64_t need_words = product(kn, {records, words});
  if (records_view.count < need_words)
    fail(kn, ": ", records_name, " holds ", records_view.count, " int32 words, needs ", need_words,
         " (", records, " records of ", words, " words: n = ", n, ", bits ", spec.bits, ", block ",
         spec.block, ")");
  return words;
}

}  // namespace amsp::backend
