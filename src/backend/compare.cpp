#include "backend/compare.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <map>
#include <ostream>

#include "core/error.h"
#include "core/rng.h"

namespace amsp::backend {
namespace {

using Floats = std::vector<float>;
using Ints = std::vector<int32_t>;
using Outputs = std::vector<std::pair<std::string, Floats>>;

// Tolerances (doc/gpu.md, "Kernel checks"). Same formula, possibly contracted
// into fused multiply-adds by another compiler: a few fp32 ulp.
constexpr double kElementwise = 1e-6;
// fp32 sums in another order (tiles, trees, warps): bounded by n u max|x|
// in the worst case, far less in practice; 1e-5 covers the sizes here.
constexpr double kReduction = 1e-5;
// bf16 results: a product or gradient summed in another order may round to
// the neighbouring bf16 value, one bf16 ulp (2^-8 relative), and that
// difference then feeds the rest of the output.
constexpr double kBf16 = 1.0 / 128;

Floats randn(int64_t n, uint64_t stream, float scale = 1.0f) {
  Floats v(static_cast<size_t>(n));
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

const char* name(DType t) { return dtype_name(t); }

double normwise_error(const Floats& got, const Floats& want) {
  if (got.size() != want.size()) return INFINITY;
  double diff = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    diff = std::isnan(d) ? INFINITY : std::max(diff, d);
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  return diff == 0 ? 0 : diff / std::max(scale, 1e-30);
}

class Checker {
 public:
  Checker(Backend& ref, Backend& dev, CompareReport& report) : ref_(ref), dev_(dev), report_(report) {}

  // Runs `f` on both backends and compares each named output.
  void compare(const std::string& kernel, const std::string& shape, double tolerance,
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
      CompareRow row{kernel, shape, want[i].first, 0, tolerance, failure};
      if (failure.empty()) row.error = normwise_error(got[i].second, want[i].second);
      report_.rows.push_back(row);
    }
  }

 private:
  Backend& ref_;
  Backend& dev_;
  CompareReport& report_;
};

std::string fmt(const char* f, auto... args) {
  char buf[160];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

// ---- the cases ---------------------------------------------------------------------------

void linear_cases(Checker& c, DType compute) {
  const double tol = compute == DType::kBF16 ? kBf16 : kReduction;
  for (auto [M, in, out] : {std::array<int64_t, 3>{1, 1, 1}, {37, 19, 23}, {65, 130, 257}})
    for (DType wt : {DType::kF32, DType::kBF16})
      for (float beta : {0.0f, 1.0f}) {
        const std::string shape =
            fmt("M=%lld in=%lld out=%lld w=%s beta=%g", (long long)M, (long long)in,
                (long long)out, name(wt), beta);
        c.compare("linear_forward", shape, tol, [&](Backend& be) {
          Buffer x = put(be, randn(M * in, 1)), w = put(be, randn(out * in, 2, 0.2f), wt);
          Buffer y = put(be, randn(M * out, 3));
          be.linear_forward(x.view(), w.view(), y.view(), M, in, out, beta);
          return Outputs{{"y", get(be, y)}};
        });
        c.compare("linear_backward_input", shape, tol, [&](Backend& be) {
          Buffer dy = put(be, randn(M * out, 4)), w = put(be, randn(out * in, 2, 0.2f), wt);
          Buffer dx = put(be, randn(M * in, 5));
          be.linear_backward_input(dy.view(), w.view(), dx.view(), M, in, out, beta);
          return Outputs{{"dx", get(be, dx)}};
        });
        if (beta == 0.0f)  // dw always accumulates
          c.compare("linear_backward_weight", shape, wt == DType::kBF16 ? kBf16 : tol,
                    [&](Backend& be) {
                      Buffer dy = put(be, randn(M * out, 4)), x = put(be, randn(M * in, 1));
                      Buffer dw = put(be, randn(out * in, 6), wt);
                      be.linear_backward_weight(dy.view(), x.view(), dw.view(), M, in, out);
                      return Outputs{{"dw", get(be, dw)}};
                    });
      }
}

void rmsnorm_cases(Checker& c) {
  for (auto [rows, dim] : {std::array<int64_t, 2>{1, 1}, {3, 257}, {70, 64}})
    for (DType wt : {DType::kF32, DType::kBF16}) {
      const std::string shape = fmt("rows=%lld dim=%lld w=dw=%s", (long long)rows, (long long)dim,
                                    name(wt));
      c.compare("rmsnorm_forward+apply", shape, kReduction, [&](Backend& be) {
        Buffer x = put(be, randn(rows * dim, 1, 3.0f)), w = put(be, randn(dim, 2), wt);
        Buffer y = be.alloc(DType::kF32, rows * dim), y2 = be.alloc(DType::kF32, rows * dim);
        Buffer inv = be.alloc(DType::kF32, rows);
        be.rmsnorm_forward(x.view(), w.view(), y.view(), inv.view(), rows, dim, 1e-5f);
        be.rmsnorm_apply(x.view(), w.view(), inv.view(), y2.view(), rows, dim);
        return Outputs{{"y", get(be, y)}, {"inv_rms", get(be, inv)}, {"y (apply)", get(be, y2)}};
      });
      c.compare("rmsnorm_backward", shape, wt == DType::kBF16 ? kBf16 : kReduction,
                [&](Backend& be) {
                  Buffer x = put(be, randn(rows * dim, 1, 3.0f)), w = put(be, randn(dim, 2), wt);
                  Buffer y = be.alloc(DType::kF32, rows * dim), inv = be.alloc(DType::kF32, rows);
                  be.rmsnorm_forward(x.view(), w.view(), y.view(), inv.view(), rows, dim, 1e-5f);
                  Buffer dy = put(be, randn(rows * dim, 3)), dx = put(be, randn(rows * dim, 4));
                  Buffer dw = put(be, randn(dim, 5), wt);
                  be.rmsnorm_backward(dy.view(), x.view(), w.view(), inv.view(), dx.view(),
                                      dw.view(), rows, dim);
                  return Outputs{{"dx (accumulated)", get(be, dx)}, {"dw (accumulated)", get(be, dw)}};
                });
    }
}

void rope_cases(Checker& c) {
  for (auto [B, T, heads, hd, stride] :
       {std::array<int64_t, 5>{1, 1, 1, 2, 2}, {2, 37, 3, 8, 40}, {1, 70, 5, 16, 96}}) {
    const std::string shape = fmt("B=%lld T=%lld heads=%lld head_dim=%lld stride=%lld",
                                  (long long)B, (long long)T, (long long)heads, (long long)hd,
                                  (long long)stride);
    c.compare("rope_forward+backward", shape, kElementwise, [&](Backend& be) {
      Buffer cs = be.alloc(DType::kF32, T * hd / 2), sn = be.alloc(DType::kF32, T * hd / 2);
      be.rope_table(cs.view(), sn.view(), T, hd, 10000.0);
      Buffer x = put(be, randn(B * T * stride, 1)), dx = put(be, randn(B * T * stride, 2));
      be.rope_forward(x.view(), cs.view(), sn.view(), B, T, heads, hd, stride);
      be.rope_backward(dx.view(), cs.view(), sn.view(), B, T, heads, hd, stride);
      return Outputs{{"cos", get(be, cs)}, {"x", get(be, x)}, {"dx", get(be, dx)}};
    });
  }
}

void attention_cases(Checker& c) {
  for (auto [B, T, H, KV, D] : {std::array<int64_t, 5>{1, 1, 1, 1, 8}, {2, 37, 4, 4, 16},
                                {1, 70, 8, 2, 24}, {1, 130, 2, 1, 64}}) {
    const std::string shape = fmt("B=%lld T=%lld H=%lld KV=%lld D=%lld", (long long)B, (long long)T,
                                  (long long)H, (long long)KV, (long long)D);
    c.compare("attention_forward+backward", shape, kReduction, [&](Backend& be) {
      const int64_t nq = B * T * H * D, nkv = B * T * KV * D;
      Buffer q = put(be, randn(nq, 1)), k = put(be, randn(nkv, 2)), v = put(be, randn(nkv, 3));
      Buffer saved = be.alloc(DType::kF32, be.attention_saved_count(B, T, H));
      Buffer out = be.alloc(DType::kF32, nq), dout = put(be, randn(nq, 4));
      be.attention_forward(q.view(), k.view(), v.view(), saved.view(), out.view(), B, T, H, KV, D);
      Buffer dq = put(be, randn(nq, 5)), dk = put(be, randn(nkv, 6)), dv = put(be, randn(nkv, 7));
      be.attention_backward(q.view(), k.view(), v.view(), saved.view(), out.view(), dout.view(),
                            dq.view(), dk.view(), dv.view(), B, T, H, KV, D);
      return Outputs{
          {"out", get(be, out)}, {"dq", get(be, dq)}, {"dk", get(be, dk)}, {"dv", get(be, dv)}};
    });
  }
}

void swiglu_cases(Checker& c) {
  for (int64_t n : {int64_t{1}, int64_t{4097}}) {
    c.compare("swiglu_forward+backward", fmt("n=%lld", (long long)n), kElementwise,
              [&](Backend& be) {
                Buffer g = put(be, randn(n, 1, 3.0f)), u = put(be, randn(n, 2));
                Buffer o = be.alloc(DType::kF32, n), dg = be.alloc(DType::kF32, n);
                Buffer du = put(be, randn(n, 3));  // dup aliases dout, as in the model
                be.swiglu_forward(g.view(), u.view(), o.view());
                be.swiglu_backward(g.view(), u.view(), du.view(), dg.view(), du.view());
                return Outputs{{"out", get(be, o)}, {"dgate", get(be, dg)}, {"dup", get(be, du)}};
              });
  }
}

void cross_entropy_cases(Checker& c) {
  for (auto [rows, V] : {std::array<int64_t, 2>{1, 1}, {13, 50}, {33, 1031}}) {
    c.compare("cross_entropy_forward+backward", fmt("rows=%lld V=%lld", (long long)rows, (long long)V),
              kReduction, [&](Backend& be) {
                Ints t = tokens(rows, V, 1);
                if (rows > 3) t[3] = -100;  // ignored
                Buffer z = put(be, randn(rows * V, 2, 2.0f)), tt = put(be, t);
                Buffer lse = be.alloc(DType::kF32, rows);
                const LossSum loss = be.cross_entropy_forward(z.view(), tt.view(), lse.view(), rows, V);
                be.cross_entropy_backward(z.view(), tt.view(), lse.view(), rows, V, 0.25f);
                return Outputs{{"loss sum, count", {static_cast<float>(loss.sum),
                                                    static_cast<float>(loss.count)}},
                               {"lse", get(be, lse)},
                               {"dlogits", get(be, z)}};
              });
  }
}

void embedding_cases(Checker& c) {
  for (auto [rows, dim, vocab] : {std::array<int64_t, 3>{1, 1, 1}, {65, 33, 50}, {300, 8, 7}})
    for (DType tt : {DType::kF32, DType::kBF16}) {
      const std::string shape = fmt("rows=%lld dim=%lld vocab=%lld table=%s", (long long)rows,
                                    (long long)dim, (long long)vocab, name(tt));
      c.compare("embedding_forward+backward", shape, tt == DType::kBF16 ? kBf16 : kReduction,
                [&](Backend& be) {
                  Buffer tok = put(be, tokens(rows, vocab, 1));  // many repeats: order matters
                  Buffer table = put(be, randn(vocab * dim, 2), tt);
                  Buffer out = be.alloc(DType::kF32, rows * dim), dout = put(be, randn(rows * dim, 3));
                  be.embedding_forward(tok.view(), table.view(), out.view(), rows, dim);
                  Buffer dtable = put(be, randn(vocab * dim, 4), tt);
                  be.embedding_backward(tok.view(), dout.view(), dtable.view(), rows, dim);
                  return Outputs{{"out", get(be, out)}, {"dtable (accumulated)", get(be, dtable)}};
                });
    }
}

void elementwise_cases(Checker& c) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{40000}})
    for (DType a : {DType::kF32, DType::kBF16})
      for (DType b : {DType::kF32, DType::kBF16}) {
        const std::string shape = fmt("n=%lld dst=%s src=%s", (long long)n, name(a), name(b));
        c.compare("copy, add, fill_zero, sum_squares", shape, kElementwise, [&](Backend& be) {
          Buffer src = put(be, randn(n, 1), b), dst = put(be, randn(n, 2), a);
          Buffer copied = be.alloc(a, n), zeroed = put(be, randn(n, 3), a);
          be.copy(src.view(), copied.view());
          be.add(dst.view(), src.view());
          be.fill_zero(zeroed.view());
          const double ss = be.sum_squares(src.view());
          return Outputs{{"copy", get(be, copied)},
                         {"add", get(be, dst)},
                         {"fill_zero", get(be, zeroed)},
                         {"sum_squares", {static_cast<float>(ss)}}};
        });
      }
}

void adamw_cases(Checker& c) {
  for (int64_t n : {int64_t{1}, int64_t{70001}})
    for (DType g : {DType::kF32, DType::kBF16}) {
      const std::string shape = fmt("n=%lld grad=%s copy=bf16", (long long)n, name(g));
      c.compare("adamw", shape, kElementwise, [&](Backend& be) {
        Buffer p = put(be, randn(n, 1)), m = put(be, randn(n, 2, 0.1f));
        Floats v0 = randn(n, 3, 0.1f);
        for (float& x : v0) x = x * x;
        Buffer v = put(be, v0), grad = put(be, randn(n, 4), g), copy = be.alloc(DType::kBF16, n);
        AdamWStep s;
        s.lr = 1e-3f, s.weight_decay = 0.1f, s.bias_correction1 = 0.19f,
        s.bias_correction2 = 0.0975f, s.grad_scale = 0.5f;
        be.adamw(p.view(), m.view(), v.view(), grad.view(), copy.view(), s);
        return Outputs{{"master", get(be, p)}, {"m", get(be, m)}, {"v", get(be, v)},
                       {"param copy", get(be, copy)}};
      });
    }
}

}  // namespace

bool CompareReport::ok() const { return failures() == 0; }

int CompareReport::failures() const {
  return static_cast<int>(std::count_if(rows.begin(), rows.end(), [](auto& r) { return !r.ok(); }));
}

std::vector<CompareRow> CompareReport::worst_per_kernel() const {
  std::vector<CompareRow> worst;
  std::map<std::string, size_t> at;
  auto badness = [](const CompareRow& r) { return r.failure.empty() ? r.error / r.tolerance : INFINITY; };
  for (const CompareRow& r : rows) {
    auto [it, fresh] = at.emplace(r.kernel, worst.size());
    if (fresh)
      worst.push_back(r);
    else if (badness(r) > badness(worst[it->second]))
      worst[it->second] = r;
  }
  return worst;
}

CompareReport compare_backends(Backend& reference, Backend& device) {
  if (reference.compute() != device.compute())
    fail("compare_backends: the reference computes in ", dtype_name(reference.compute()),
         ", the device backend in ", dtype_name(device.compute()));
  CompareReport report;
  Checker c(reference, device, report);
  elementwise_cases(c);
  embedding_cases(c);
  linear_cases(c, reference.compute());
  rmsnorm_cases(c);
  rope_cases(c);
  attention_cases(c);
  swiglu_cases(c);
  cross_entropy_cases(c);
  adamw_cases(c);
  return report;
}

void print_report(const CompareReport& report, std::ostream& out) {
  char line[512];
  std::snprintf(line, sizeof line, "%-36s %-44s %-18s %10s %10s  %s\n", "kernel (worst case)",
                "shape", "output", "error", "tolerance", "");
  out << line;
  auto print = [&](const CompareRow& r) {
    std::snprintf(line, sizeof line, "%-36s %-44s %-18s %10.2e %10.2e  %s\n", r.kernel.c_str(),
                  r.shape.c_str(), r.output.c_str(), r.error, r.tolerance,
                  r.ok() ? "ok" : r.failure.empty() ? "FAIL" : ("FAIL: " + r.failure).c_str());
    out << line;
  };
  for (const CompareRow& r : report.worst_per_kernel()) print(r);
  if (report.ok()) {
    out << report.rows.size() << " outputs compared, all within tolerance\n";
    return;
  }
  out << "failing:\n";
  for (const CompareRow& r : report.rows)
    if (!r.ok()) print(r);
  out << report.failures() << " of " << report.rows.size() << " outputs outside tolerance\n";
}

}  // namespace amsp::backend
