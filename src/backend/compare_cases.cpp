#include "backend/compare_cases.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <map>

#include "backend/compare_tolerance.h"
#include "core/rng.h"

namespace amsp::backend::cases {
namespace {

using namespace tolerance;
using Ints = std::vector<int32_t>;

// Inputs are a pure function of (stream, index), so both backends get the same
// ones; generated in parallel because layer-sized cases draw ~10^8 of them.
Floats randn(int64_t n, uint64_t stream, float scale = 1.0f) {
  Floats v(static_cast<size_t>(n));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = scale * static_cast<float>(random_normal(23, stream, i));
  return v;
}

Ints tokens(int64_t n, int64_t vocab, uint64_t stream) {
  Ints t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    t[static_cast<size_t>(i)] = static_cast<int32_t>(random_below(23, stream, i, vocab));
  return t;
}

Buffer put(Backend& be, const Floats& x, DType t = DType::kF32) {
  Buffer b = be.alloc(t, static_cast<int64_t>(x.size()));
  be.from_host(x.data(), b.view());
  return b;
}

Buffer put(Backend& be, const Ints& x) {
  Buffer b = be.alloc(DType::kI32, static_cast<int64_t>(x.size()));
  be.from_host(x.data(), b.view());
  return b;
}

Floats get(Backend& be, const Buffer& b) {
  Floats x(static_cast<size_t>(b.count()));
  be.to_host(b.view(), x.data());
  return x;
}

double max_abs(const Floats& x) {
  double m = 0;
  for (float v : x) m = std::max(m, static_cast<double>(std::fabs(v)));
  return m;
}

// The largest Euclidean norm of the consecutive rows of `width` elements.
double max_row_norm(const Floats& x, int64_t width) {
  double m = 0;
  for (size_t r = 0; r + static_cast<size_t>(width) <= x.size(); r += static_cast<size_t>(width)) {
    double s = 0;
    for (size_t i = r; i < r + static_cast<size_t>(width); ++i) s += double{x[i]} * x[i];
    m = std::max(m, s);
  }
  return std::sqrt(m);
}

const char* name(DType t) { return dtype_name(t); }

std::string fmt(const char* f, auto... args) {
  char buf[160];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

// max_i |y_i| + |beta| |before_i|: bounds the products that made y = p + beta before.
double max_product(const Floats& y, float beta, const Floats& before) {
  double m = 0;
  for (size_t i = 0; i < y.size() && i < before.size(); ++i)
    m = std::max(m, std::fabs(double{y[i]}) + std::fabs(beta * double{before[i]}));
  return m;
}

// An output of n-term products plus beta times what it held (`before`): the
// n products, and `before` as one more term of the sum. In bf16 compute the
// bound also allows one bf16 ulp of the product, from when the product was
// rounded to bf16 before beta * before was added; the products now add it in
// fp32 and round once, in the output's dtype (`stored`), so this is slack, and
// under the bf16 floor (kBf16) of these comparisons either way.
Output product(const char* name, Floats values, int64_t n, float beta, const Floats& before,
               bool bf16_product) {
  const double t = bf16_product ? bf16_rounded(sum_of(n), max_product(values, beta, before),
                                               max_abs(values))
                                : sum_of(n + (beta != 0));
  return {name, std::move(values), t};
}

// dw += dy^T x over M rows, as the CPU backend defines it for each dtype: fp32
// sums added to dw in fp32, then in a bf16 dw the sum rounded to bf16 (the
// rounded values are dw's own, at most max |dw|); in bf16 compute with the
// same slack as `product`.
Output weight_gradient_output(Floats dw, int64_t M, const Floats& before, DType w_dtype,
                              bool bf16_product) {
  const double mx = max_abs(dw);
  double t = bf16_product ? bf16_rounded(sum_of(M), max_product(dw, 1, before), mx) : sum_of(M + 1);
  if (w_dtype == DType::kBF16) t = bf16_rounded(t, mx, mx);
  return {"dw", std::move(dw), t};
}

// The largest number of rows that share a token: the terms of one dtable row.
int64_t max_repeats(const Ints& t) {
  std::map<int32_t, int64_t> n;
  int64_t m = 0;
  for (int32_t x : t) m = std::max(m, ++n[x]);
  return m;
}

}  // namespace

void Checker::compare(const std::string& kernel, const std::string& shape, double floor,
                      const std::function<Outputs(Backend&)>& f) {
  const Outputs want = f(ref_);
  Outputs got;
  std::string failure;
  try {
    got = f(dev_);
    dev_.synchronize();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  for (size_t i = 0; i < want.size(); ++i) {
    CompareRow row{kernel, shape, want[i].name, 0, std::max(floor, want[i].tolerance), failure};
    if (failure.empty()) row.error = normwise_error(got[i].values, want[i].values);
    report_.rows.push_back(row);
  }
}

// bf16 activations: the inputs are the same bf16 values on both backends; a bf16
// output with beta 0 is the product rounded once (as an fp32 one is), with beta
// != 0 the sum with beta * y rounded once more.
void linear_cases(Checker& c, const LinearShape& s, bool weight_gradient) {
  const auto [M, in, out, wt, beta, act] = s;
  const bool bf16 = c.compute() == DType::kBF16;
  const double floor = bf16 ? kBf16 : kReduction;
  std::string shape = fmt("M=%lld in=%lld out=%lld w=%s beta=%g", (long long)M,
                          (long long)in, (long long)out, name(wt), beta);
  if (act != DType::kF32) shape += fmt(" act=%s", name(act));
  // The output as the backend stores it: a bf16 one rounded once more unless beta is 0.
  auto stored = [&](Output o) {
    if (act == DType::kBF16 && beta != 0.0f) {
      const double mx = max_abs(o.values);
      o.tolerance = bf16_rounded(o.tolerance, mx, mx);
    }
    return o;
  };
  c.compare("linear_forward", shape, floor, [&](Backend& be) {
    Buffer y = put(be, randn(M * out, 3), act);
    const Floats y0 = get(be, y);
    Buffer x = put(be, randn(M * in, 1), act), w = put(be, randn(out * in, 2, 0.2f), wt);
    be.linear_forward(x.view(), w.view(), y.view(), M, in, out, beta);
    return Outputs{stored(product("y", get(be, y), in, beta, y0, bf16))};
  });
  // The residual stream's product: y = r + x W^T, fp32 r and y apart (a device
  // reads r in the product's epilogue); r left as it was.
  if (beta == 1.0f)
    c.compare("linear_forward_residual", shape, floor, [&](Backend& be) {
      const Floats r0 = randn(M * out, 3);
      Buffer r = put(be, r0), y = put(be, randn(M * out, 7));
      Buffer x = put(be, randn(M * in, 1), act), w = put(be, randn(out * in, 2, 0.2f), wt);
      be.linear_forward_residual(x.view(), w.view(), r.view(), y.view(), M, in, out);
      Buffer z = put(be, r0);  // and in place: r and y one matrix
      be.linear_forward_residual(x.view(), w.view(), z.view(), z.view(), M, in, out);
      return Outputs{product("y", get(be, y), in, 1.0f, r0, bf16),
                     {"r (read only)", get(be, r), 0.0},
                     product("y in place", get(be, z), in, 1.0f, r0, bf16)};
    });
  c.compare("linear_backward_input", shape, floor, [&](Backend& be) {
    Buffer dx = put(be, randn(M * in, 5), act);
    const Floats dx0 = get(be, dx);
    Buffer dy = put(be, randn(M * out, 4), act), w = put(be, randn(out * in, 2, 0.2f), wt);
    be.linear_backward_input(dy.view(), w.view(), dx.view(), M, in, out, beta);
    return Outputs{stored(product("dx", get(be, dx), out, beta, dx0, bf16))};
  });
  if (!weight_gradient) return;
  // Added to (a later micro-batch), and written over values it must not read
  // (the first: beta 0).
  c.compare("linear_backward_weight", shape, wt == DType::kBF16 ? kBf16 : floor, [&](Backend& be) {
    const Floats dw0 = randn(out * in, 6);
    Buffer dy = put(be, randn(M * out, 4), act), x = put(be, randn(M * in, 1), act);
    Buffer dw = put(be, dw0, wt), written = put(be, randn(out * in, 8), wt);
    be.linear_backward_weight(dy.view(), x.view(), dw.view(), M, in, out, 1.0f);
    be.linear_backward_weight(dy.view(), x.view(), written.view(), M, in, out, 0.0f);
    Output w = weight_gradient_output(get(be, written), M,
                                      Floats(static_cast<size_t>(out * in), 0.0f), wt, bf16);
    w.name = "dw (written)";
    return Outputs{weight_gradient_output(get(be, dw), M, dw0, wt, bf16), std::move(w)};
  });
}

// inv_rms comes from a sum of dim squares (positive terms); y is a few roundings
// more. Backward: c = sum_k w dy x over the row (a sum of dim terms of both
// signs) and inv_rms^3 (three times inv_rms's error) make dx; dw sums over rows.
// bf16 activations (y written, dy read as bf16): y is rounded once after the
// fp32 computation; dy is the same rounded input on both backends.
void rmsnorm_cases(Checker& c, const RmsnormShape& s) {
  const auto [rows, dim, wt, act] = s;
  const std::string shape = fmt("rows=%lld dim=%lld w=dw=%s act=%s", (long long)rows, (long long)dim,
                                name(wt), name(act));
  const double t_forward = sum_of(dim) + kElementwise;
  auto t_y = [&](const Floats& y) {
    const double mx = max_abs(y);
    return act == DType::kBF16 ? bf16_rounded(t_forward, mx, mx) : t_forward;
  };
  c.compare("rmsnorm_forward+apply", shape, kReduction, [&](Backend& be) {
    Buffer x = put(be, randn(rows * dim, 1, 3.0f)), w = put(be, randn(dim, 2), wt);
    Buffer y = be.alloc(act, rows * dim), y2 = be.alloc(act, rows * dim);
    Buffer inv = be.alloc(DType::kF32, rows);
    be.rmsnorm_forward(x.view(), w.view(), y.view(), inv.view(), rows, dim, 1e-5f);
    be.rmsnorm_apply(x.view(), w.view(), inv.view(), y2.view(), rows, dim);
    const Floats yv = get(be, y), y2v = get(be, y2);
    return Outputs{{"y", yv, t_y(yv)}, {"inv_rms", get(be, inv), t_forward}, {"y (apply)", y2v, t_y(y2v)}};
  });
  c.compare("rmsnorm_backward", shape, wt == DType::kBF16 ? kBf16 : kReduction, [&](Backend& be) {
    Buffer x = put(be, randn(rows * dim, 1, 3.0f)), w = put(be, randn(dim, 2), wt);
    Buffer y = be.alloc(DType::kF32, rows * dim), inv = be.alloc(DType::kF32, rows);
    be.rmsnorm_forward(x.view(), w.view(), y.view(), inv.view(), rows, dim, 1e-5f);
    Buffer dy = put(be, randn(rows * dim, 3), act), dx = put(be, randn(rows * dim, 4));
    Buffer dw = put(be, randn(dim, 5), wt), rounded = be.alloc(DType::kBF16, rows * dim);
    be.rmsnorm_backward(dy.view(), x.view(), w.view(), inv.view(), dx.view(), dw.view(), rows, dim,
                        rounded.view(), 1.0f);
    // The weight gradient written (dw_beta 0) over values it must not read.
    Buffer dx2 = put(be, randn(rows * dim, 4)), written = put(be, randn(dim, 9), wt);
    be.rmsnorm_backward(dy.view(), x.view(), w.view(), inv.view(), dx2.view(), written.view(), rows,
                        dim, View{}, 0.0f);
    Floats dw_values = get(be, dw), written_values = get(be, written);
    const double mx = max_abs(dw_values), t_dx = 3 * sum_of(dim) + kElementwise;
    double t_dw = sum_of(rows + 1) + sum_of(dim) + kElementwise;
    if (wt == DType::kBF16) t_dw = bf16_rounded(t_dw, mx, mx);
    double t_written = sum_of(rows) + sum_of(dim) + kElementwise;
    if (wt == DType::kBF16)
      t_written = bf16_rounded(t_written, max_abs(written_values), max_abs(written_values));
    return Outputs{{"dx (accumulated)", get(be, dx), t_dx},
                   {"dx rounded to bf16", get(be, rounded), bf16_rounded(t_dx)},
                   {"dw (accumulated)", std::move(dw_values), t_dw},
                   {"dw (written)", std::move(written_values), t_written}};
  });
}

// bf16 x: rotated in fp32 from the widened values, rounded once (as swiglu_case).
void rope_case(Checker& c, const RopeShape& s, DType act) {
  const auto [B, T, heads, hd, stride] = s;
  const std::string shape = fmt("B=%lld T=%lld heads=%lld head_dim=%lld stride=%lld act=%s", (long long)B,
                                (long long)T, (long long)heads, (long long)hd, (long long)stride, name(act));
  c.compare("rope_forward+backward", shape, kElementwise, [&](Backend& be) {
    Buffer cs = be.alloc(DType::kF32, T * hd / 2), sn = be.alloc(DType::kF32, T * hd / 2);
    be.rope_table(cs.view(), sn.view(), T, hd, 10000.0);
    Buffer x = put(be, randn(B * T * stride, 1), act), dx = put(be, randn(B * T * stride, 2), act);
    be.rope_forward(x.view(), cs.view(), sn.view(), B, T, heads, hd, stride);
    be.rope_backward(dx.view(), cs.view(), sn.view(), B, T, heads, hd, stride);
    const Floats xv = get(be, x), dxv = get(be, dx);
    auto t = [&](const Floats& v) {
      const double mx = max_abs(v);
      return act == DType::kBF16 ? bf16_rounded(kElementwise, mx, mx) : kElementwise;
    };
    return Outputs{{"cos", get(be, cs), kElementwise}, {"x", xv, t(xv)}, {"dx", dxv, t(dxv)}};
  });
}

// A score is a sum of D products; |q.k| scale bounds it and every partial sum
// of it (Cauchy-Schwarz), so its error is at most sum_of(D) times that, and a
// probability exp(score - lse) has that relative error twice (its score, and
// lse through the row's scores) plus lse's own: a positive sum over up to T
// keys and up to T online rescales. Each output is then a sum of terms whose
// weights carry these relative errors: out = P v over T keys; dv = P^T dout
// over the G T query rows of a kv group; dq and dk sum over T and G T terms
// P (dP - delta), where dP = dout.v sums D terms and delta = dout.out uses out.
//
// With bf16 products both backends round q, k, v and dout to bf16, and the
// device's tensor cores also round each weight, P or dS = P (dP - delta), to
// bf16 (relative error d_j, |d_j| <= u = 2^-8) before the product that takes
// it. out = sum_j P~_j v_j / sum_j P~_j then moves by sum_j P_j d_j (v_j - out),
// at most 2 u max |v|. A gradient is a sum of terms w_j x_j whose weights carry
// such errors, spread evenly over [-u, u] (variance u^2 / 3): with Higham and
// Mary's lambda the error is within lambda u / sqrt(3) of sqrt(sum (w_j x_j)^2),
// which for these random inputs is the output's own scale; lse's error (at
// most u, from the rounded probabilities it sums) scales a row by 1 + u more.
// Columns [first, first + n) of a [rows, width] matrix, and the matrix whose
// rows are the rows of a, b and c side by side.
Floats columns(const Floats& x, int64_t rows, int64_t width, int64_t first, int64_t n) {
  Floats out(rows * n);
  for (int64_t r = 0; r < rows; ++r)
    std::copy_n(x.begin() + r * width + first, n, out.begin() + r * n);
  return out;
}

Floats side_by_side(const Floats& a, const Floats& b, const Floats& c, int64_t rows) {
  const int64_t na = int64_t(a.size()) / rows, nb = int64_t(b.size()) / rows,
                nc = int64_t(c.size()) / rows;
  Floats out;
  out.reserve(a.size() + b.size() + c.size());
  for (int64_t r = 0; r < rows; ++r) {
    out.insert(out.end(), a.begin() + r * na, a.begin() + (r + 1) * na);
    out.insert(out.end(), b.begin() + r * nb, b.begin() + (r + 1) * nb);
    out.insert(out.end(), c.begin() + r * nc, c.begin() + (r + 1) * nc);
  }
  return out;
}

// bf16 activations (q|k|v, out, dout, dqkv): the same bf16 inputs on both
// backends, each output rounded once (one bf16 ulp); and a fused backward's
// delta = rowsum(dout * out) reads the rounded out where the CPU sums P dP
// exactly: u (2^-8) of each gradient more. q and k are rotated by RoPE before
// attention and dq, dk rotated back by it, as the model calls them (both
// backends' tables are the same bits, and a rotation keeps each row's norm).
void attention_case(Checker& c, const AttentionShape& s, DType act) {
  const auto [B, T, H, KV, D] = s;
  std::string shape = fmt("B=%lld T=%lld H=%lld KV=%lld D=%lld", (long long)B, (long long)T,
                          (long long)H, (long long)KV, (long long)D);
  if (act != DType::kF32) shape += fmt(" act=%s", name(act));
  const bool bf16 = c.compute() == DType::kBF16, bf16_act = act == DType::kBF16;
  const double u = 0x1p-8;
  c.compare("attention_forward+backward", shape, kReduction, [&](Backend& be) {
    const int64_t N = B * T, nq = N * H * D, nkv = N * KV * D, group = H / KV;
    const int64_t row = (H + 2 * KV) * D;
    const Floats qs = randn(nq, 1), ks = randn(nkv, 2), vs = randn(nkv, 3);
    Buffer qkv = put(be, side_by_side(qs, ks, vs, N), act);
    Buffer saved = be.alloc(DType::kF32, be.attention_saved_count(B, T, H));
    Buffer out = be.alloc(act, nq), dout = put(be, randn(nq, 4), act);
    Buffer cos = be.alloc(DType::kF32, T * D / 2), sin = be.alloc(DType::kF32, T * D / 2);
    be.rope_table(cos.view(), sin.view(), T, D, 10000.0);
    const RopeTables rope{cos.view(), sin.view()};
    be.rope_forward(qkv.view(), cos.view(), sin.view(), B, T, H + KV, D, row);
    be.attention_forward(qkv.view(), saved.view(), out.view(), B, T, H, KV, D);
    Buffer dqkv = put(be, side_by_side(randn(nq, 5), randn(nkv, 6), randn(nkv, 7), N), act);
    be.attention_backward(qkv.view(), rope, saved.view(), out.view(), dout.view(), dqkv.view(), B,
                          T, H, KV, D);
    const Floats d = get(be, dqkv);
    const double score = max_row_norm(qs, D) * max_row_norm(ks, D) / std::sqrt(double(D));
    const double t_p = 2 * sum_of(D) * score + sum_of(2 * T) + kElementwise;
    const double t_out = sum_of(2 * T) + t_p, t_ds = t_p + sum_of(D) + t_out;
    Floats out_values = get(be, out);
    const double w_out = bf16 ? 2 * u * max_abs(vs) / std::max(max_abs(out_values), 1e-30) : 0;
    const double w_grad = (bf16 ? kLambda * u / std::sqrt(3.0) + u : 0) + (bf16_act ? u : 0);
    auto stored = [&](double t) { return bf16_act ? bf16_rounded(t) : t; };
    return Outputs{{"out", std::move(out_values), stored(t_out + w_out)},
                   {"dq", columns(d, N, row, 0, H * D), stored(sum_of(T) + t_ds + w_grad)},
                   {"dk", columns(d, N, row, H * D, KV * D),
                    stored(sum_of(group * T) + t_ds + w_grad)},
                   {"dv", columns(d, N, row, (H + KV) * D, KV * D),
                    stored(sum_of(group * T) + t_p + w_grad)}};
  });
}

// bf16 activations: the same fp32 arithmetic on the widened inputs, each
// output rounded once, so a backend may land on the neighbouring bf16 value
// where the fp32 results differ in their last bits.
void swiglu_case(Checker& c, int64_t rows, int64_t I, DType act) {
  c.compare("swiglu_forward+backward",
            fmt("rows=%lld I=%lld act=%s", (long long)rows, (long long)I, name(act)), kElementwise,
            [&](Backend& be) {
              Buffer gu = put(be, randn(2 * rows * I, 1, 3.0f), act), dout = put(be, randn(rows * I, 3), act);
              Buffer o = be.alloc(act, rows * I), d = be.alloc(act, 2 * rows * I);
              be.swiglu_forward(gu.view(), o.view(), rows, I);
              be.swiglu_backward(gu.view(), dout.view(), d.view(), rows, I);
              const Floats ov = get(be, o), dv = get(be, d);
              auto t = [&](const Floats& x) {
                const double mx = max_abs(x);
                return act == DType::kBF16 ? bf16_rounded(kElementwise, mx, mx) : kElementwise;
              };
              return Outputs{{"out", ov, t(ov)},
                             {"dgate", columns(dv, rows, 2 * I, 0, I), t(dv)},
                             {"dup", columns(dv, rows, 2 * I, I, I), t(dv)}};
            });
}

// lse = max + log(sum of V positive terms): an absolute error of sum_of(V) plus
// a few ulp of lse. The loss adds up the rows' lse - target logit (positive
// terms); dlogits = scale (exp(z - lse) - onehot) has lse's error relatively.
// bf16 logits: the same widened values on both backends; dlogits rounded once.
void cross_entropy_case(Checker& c, int64_t rows, int64_t V, DType act) {
  std::string shape = fmt("rows=%lld V=%lld", (long long)rows, (long long)V);
  if (act != DType::kF32) shape += fmt(" act=%s", name(act));
  c.compare("cross_entropy_forward+backward", shape,
            kReduction, [&](Backend& be) {
              Ints t = tokens(rows, V, 1);
              if (rows > 3) t[3] = -100;  // ignored
              Buffer z = put(be, randn(rows * V, 2, 2.0f), act), tt = put(be, t);
              Buffer lse = be.alloc(DType::kF32, rows);
              const LossSum loss = be.cross_entropy_forward(z.view(), tt.view(), lse.view(), rows, V);
              be.cross_entropy_backward(z.view(), tt.view(), lse.view(), rows, V, 0.25f);
              Floats lse_values = get(be, lse);
              const double lse_max = std::max(max_abs(lse_values), 1e-30);
              const double lse_error = sum_of(V) + kElementwise * lse_max;
              const double loss_scale = std::max(std::fabs(loss.sum), double(loss.count));
              const double t_loss =
                  (double(rows) * lse_error + sum_of(rows) * std::fabs(loss.sum)) /
                  std::max(loss_scale, 1e-30);
              const Floats dz = get(be, z);
              const double mz = max_abs(dz),
                           t_dz = act == DType::kBF16 ? bf16_rounded(sum_of(V) + kElementwise, mz, mz)
                                                      : sum_of(V) + kElementwise;
              return Outputs{{"loss sum, count",
                              {static_cast<float>(loss.sum), static_cast<float>(loss.count)},
                              t_loss},
                             {"lse", std::move(lse_values), lse_error / lse_max},
                             {"dlogits", dz, t_dz}};
            });
}

// out is a gather (exact); a dtable row adds the rows of its token to what it
// held: as many terms as the most frequent token has rows, plus one.
void embedding_case(Checker& c, int64_t rows, int64_t dim, int64_t vocab, DType tt) {
  const std::string shape = fmt("rows=%lld dim=%lld vocab=%lld table=%s", (long long)rows,
                                (long long)dim, (long long)vocab, name(tt));
  c.compare("embedding_forward+backward", shape, tt == DType::kBF16 ? kBf16 : kReduction,
            [&](Backend& be) {
              const Ints toks = tokens(rows, vocab, 1);  // many repeats: order matters
              Buffer tok = put(be, toks), table = put(be, randn(vocab * dim, 2), tt);
              Buffer out = be.alloc(DType::kF32, rows * dim), dout = put(be, randn(rows * dim, 3));
              be.embedding_forward(tok.view(), table.view(), out.view(), rows, dim);
              Buffer dtable = put(be, randn(vocab * dim, 4), tt);
              be.embedding_backward(tok.view(), dout.view(), dtable.view(), rows, dim);
              Floats dt = get(be, dtable);
              const double mx = max_abs(dt), t_sum = sum_of(max_repeats(toks) + 1);
              return Outputs{
                  {"out", get(be, out), kElementwise},
                  {"dtable (accumulated)", std::move(dt),
                   tt == DType::kBF16 ? bf16_rounded(t_sum, mx, mx) : t_sum}};
            });
}

// One rounding each at most, the same on both sides; sum_squares is summed in
// double, whose errors are far below fp32's.
void elementwise_case(Checker& c, int64_t n, DType a, DType b) {
  const std::string shape = fmt("n=%lld dst=%s src=%s", (long long)n, name(a), name(b));
  c.compare("copy, add, fill_zero, sum_squares", shape, kElementwise, [&](Backend& be) {
    Buffer src = put(be, randn(n, 1), b), dst = put(be, randn(n, 2), a);
    Buffer copied = be.alloc(a, n), zeroed = put(be, randn(n, 3), a);
    be.copy(src.view(), copied.view());
    be.add(dst.view(), src.view());
    be.fill_zero(zeroed.view());
    const double ss = be.sum_squares(src.view());
    return Outputs{{"copy", get(be, copied), kElementwise},
                   {"add", get(be, dst), kElementwise},
                   {"fill_zero", get(be, zeroed), kElementwise},
                   {"sum_squares", {static_cast<float>(ss)}, kElementwise}};
  });
}

// The update is elementwise; the bf16 parameter copy is the updated master
// rounded, which lands on the neighbouring bf16 value when the masters differ
// in their last bits.
void adamw_case(Checker& c, int64_t n, DType g) {
  const std::string shape = fmt("n=%lld grad=%s copy=bf16", (long long)n, name(g));
  c.compare("adamw", shape, kElementwise, [&](Backend& be) {
    Buffer p = put(be, randn(n, 1)), m = put(be, randn(n, 2, 0.1f));
    Floats v0 = randn(n, 3, 0.1f);
    for (float& x : v0) x = x * x;
    Buffer v = put(be, v0), grad = put(be, randn(n, 4), g), copy = be.alloc(DType::kBF16, n);
    AdamWStep s;
    s.lr = 1e-3f, s.weight_decay = 0.1f, s.bias_correction1 = 0.19f, s.bias_correction2 = 0.0975f,
    s.grad_scale = 0.5f;
    be.adamw(p.view(), m.view(), v.view(), grad.view(), copy.view(), s);
    Floats copied = get(be, copy);
    const double mx = max_abs(copied);
    return Outputs{{"master", get(be, p), kElementwise},
                   {"m", get(be, m), kElementwise},
                   {"v", get(be, v), kElementwise},
                   {"param copy", std::move(copied), bf16_rounded(kElementwise, mx, mx)}};
  });
}

void quant_case(Checker& c, int64_t n, int64_t records, const kernels::quant::Spec& spec, DType in,
                DType out) {
  const std::string shape = fmt("n=%lld records=%lld bits=%d block=%lld %s->%s", (long long)n,
                                (long long)records, spec.bits, (long long)spec.block, name(in), name(out));
  // Blocks of magnitudes from 1e-2 to 1e2, so that the scales differ.
  Floats x = randn(records * n, 40);
  for (int64_t i = 0; i < records * n; ++i)
    x[static_cast<size_t>(i)] *= std::pow(10.0f, static_cast<float>((i / 97) % 5 - 2));
  c.compare("quantize, dequantize, dequantize_sum", shape, 0, [&](Backend& be) {
    const int64_t words = records * kernels::quant::record_words(n, spec);
    Buffer v = put(be, x, in), w = be.alloc(DType::kI32, words);
    Buffer y = be.alloc(out, records * n), sum = be.alloc(out, n);
    be.quantize(v.view(), n, records, w.view(), spec);
    be.dequantize(w.view(), n, records, y.view(), spec);
    be.dequantize_sum(w.view(), n, records, sum.view(), spec);
    Ints host(static_cast<size_t>(words));
    be.to_host(w.view(), host.data());
    Floats bytes(host.size() * 4);  // each byte of the records as a value, exactly
    for (size_t i = 0; i < bytes.size(); ++i)
      bytes[i] = static_cast<float>(reinterpret_cast<const uint8_t*>(host.data())[i]);
    return Outputs{{"records", bytes, 0}, {"dequantize", get(be, y), 0}, {"dequantize_sum", get(be, sum), 0}};
  });
}

}  // namespace amsp::backend::cases
