// Each kernel's forward against a naive double-precision reference and its
// backward against central finite differences of a random linear functional
// of its output.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "kernels/common/math.h"
#include "kernels/cpu/ops.h"
#include "src/core/rng.h"

namespace amsp::kernels {
namespace {

std::vector<float> randn(int64_t n, uint64_t stream, float scale = 1.0f) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(random_normal(7, stream, i));
  return v;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Central difference of f() with respect to x[i].
double numgrad(std::vector<float>& x, int64_t i, const std::function<double()>& f, float h = 1e-2f) {
  const float old = x[i];
  x[i] = old + h;
  const float up = x[i];
  const double fp = f();
  x[i] = old - h;
  const float down = x[i];
  const double fm = f();
  x[i] = old;
  return (fp - fm) / (static_cast<double>(up) - down);
}

// Checks analytic gradient g against finite differences of f for every
// `stride`-th element of x.
void check_grad(const char* what, std::vector<float>& x, const std::vector<float>& g,
                const std::function<double()>& f, int64_t stride = 1, double rtol = 2e-2,
                double atol = 2e-3, float h = 1e-2f) {
  ASSERT_EQ(x.size(), g.size());
  double scale = 0;
  for (float v : g) scale = std::max(scale, std::fabs(static_cast<double>(v)));
  for (int64_t i = 0; i < static_cast<int64_t>(x.size()); i += stride) {
    const double n = numgrad(x, i, f, h);
    EXPECT_NEAR(g[i], n, atol * std::max(1.0, scale) + rtol * std::fabs(n)) << what << "[" << i << "]";
  }
}

TEST(CommonMath, FastExpMatchesStdExp) {
  double worst = 0;
  for (float x = -87.0f; x < 88.0f; x += 0.0137f) {
    const double ref = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(fast_exp(x) - ref) / ref);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(fast_exp(-200.0f), 0.0f);
  EXPECT_EQ(fast_exp(-INFINITY), 0.0f);
  EXPECT_EQ(fast_exp(0.0f), 1.0f);
}

TEST(CommonMath, SiluAndGrad) {
  for (float x = -20.0f; x < 20.0f; x += 0.173f) {
    const double s = 1.0 / (1.0 + std::exp(-static_cast<double>(x)));
    EXPECT_NEAR(silu(x), x * s, 1e-6 * (1 + std::fabs(x)));
    EXPECT_NEAR(silu_grad(x), s * (1 + x * (1 - s)), 1e-6);
  }
}

TEST(CommonMath, AdamWElement) {
  float p = 0.5f, m = 0.1f, v = 0.01f;
  const float g = 0.3f, lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  const int step = 3;
  const double bc1 = 1 - std::pow(0.9, step), bc2 = 1 - std::pow(0.95, step);
  const double m2 = 0.9 * 0.1 + 0.1 * 0.3, v2 = 0.95 * 0.01 + 0.05 * 0.09;
  const double p2 = 0.5 - 1e-2 * (m2 / bc1 / (std::sqrt(v2 / bc2) + 1e-8) + 0.1 * 0.5);
  adamw_update_element(p, m, v, g, lr, b1, b2, eps, wd, static_cast<float>(bc1),
                       static_cast<float>(bc2));
  EXPECT_NEAR(m, m2, 1e-7);
  EXPECT_NEAR(v, v2, 1e-8);
  EXPECT_NEAR(p, p2, 1e-6);

  std::vector<float> P = {0.5f, -1.0f}, M = {0.1f, 0.0f}, Vv = {0.01f, 0.0f}, G = {0.3f, 0.0f};
  adamw_update(P.data(), M.data(), Vv.data(), G.data(), 2, lr, b1, b2, eps, wd, step);
  EXPECT_NEAR(P[0], p2, 1e-6);
  EXPECT_NEAR(P[1], -1.0 * (1 - 1e-3), 1e-7);  // zero gradient: decay only
}

TEST(Ops, BlasUsesTheCpusVectorUnits) {
  // OpenBLAS releases that do not know this CPU fall back to SSE3 kernels;
  // matmul.cpp switches them to the best core the CPU supports.
  const std::string core = blas_core_name();
#if defined(__x86_64__)
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr && __builtin_cpu_supports("avx2"))
    EXPECT_NE(core, "Prescott");
#endif
  EXPECT_FALSE(core.empty());
}

TEST(Ops, Linear) {
  const int64_t M = 5, in = 7, out = 3;
  auto x = randn(M * in, 1), w = randn(out * in, 2), r = randn(M * out, 3);
  std::vector<float> y(M * out);
  linear_forward(x.data(), w.data(), y.data(), M, in, out);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t j = 0; j < in; ++j) s += static_cast<double>(x[i * in + j]) * w[o * in + j];
      EXPECT_NEAR(y[i * out + o], s, 1e-5);
    }
  auto f = [&] {
    linear_forward(x.data(), w.data(), y.data(), M, in, out);
    return dot(y, r);
  };
  std::vector<float> dx(M * in, 0.0f), dw(out * in, 1.0f);
  linear_backward_input(r.data(), w.data(), dx.data(), M, in, out);
  linear_backward_weight(r.data(), x.data(), dw.data(), M, in, out);
  for (float& v : dw) v -= 1.0f;  // accumulated onto 1
  check_grad("dx", x, dx, f);
  check_grad("dw", w, dw, f);
}

TEST(Ops, RmsNorm) {
  const int64_t rows = 4, dim = 16;
  const float eps = 1e-5f;
  auto x = randn(rows * dim, 1), w = randn(dim, 2), r = randn(rows * dim, 3);
  for (float& v : w) v += 1.0f;
  std::vector<float> y(rows * dim), inv(rows);
  rmsnorm_forward(x.data(), w.data(), y.data(), inv.data(), rows, dim, eps);
  for (int64_t i = 0; i < rows; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < dim; ++j) ss += static_cast<double>(x[i * dim + j]) * x[i * dim + j];
    const double ri = 1 / std::sqrt(ss / dim + eps);
    for (int64_t j = 0; j < dim; ++j) EXPECT_NEAR(y[i * dim + j], w[j] * x[i * dim + j] * ri, 1e-5);
  }
  std::vector<float> y2(rows * dim);
  rmsnorm_apply(x.data(), w.data(), inv.data(), y2.data(), rows, dim);
  EXPECT_EQ(y, y2);

  std::vector<float> dx(rows * dim, 0.5f), dw(dim, 0.25f);
  rmsnorm_backward(r.data(), x.data(), w.data(), inv.data(), dx.data(), dw.data(), rows, dim);
  for (float& v : dx) v -= 0.5f;
  for (float& v : dw) v -= 0.25f;
  auto f = [&] {
    rmsnorm_forward(x.data(), w.data(), y.data(), inv.data(), rows, dim, eps);
    return dot(y, r);
  };
  check_grad("dx", x, dx, f);
  check_grad("dw", w, dw, f);
}

TEST(Ops, Rope) {
  const int64_t B = 2, T = 5, heads = 3, D = 8, stride = heads * D + 4;  // padded rows
  const double theta = 10000.0;
  std::vector<float> cos(T * D / 2), sin(T * D / 2);
  rope_table(cos.data(), sin.data(), T, D, theta);
  auto x = randn(B * T * stride, 1), r = randn(B * T * stride, 2);
  auto y = x;
  rope_forward(y.data(), cos.data(), sin.data(), B, T, heads, D, stride);
  for (int64_t row = 0; row < B * T; ++row) {
    const int64_t pos = row % T;
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < D / 2; ++i) {
        const double ang = pos * std::pow(theta, -2.0 * i / D);
        const int64_t a = row * stride + h * D + i, b = a + D / 2;
        EXPECT_NEAR(y[a], x[a] * std::cos(ang) - x[b] * std::sin(ang), 1e-5);
        EXPECT_NEAR(y[b], x[b] * std::cos(ang) + x[a] * std::sin(ang), 1e-5);
      }
    for (int64_t j = heads * D; j < stride; ++j) EXPECT_EQ(y[row * stride + j], x[row * stride + j]);
  }
  auto dx = r;
  rope_backward(dx.data(), cos.data(), sin.data(), B, T, heads, D, stride);
  auto f = [&] {
    y = x;
    rope_forward(y.data(), cos.data(), sin.data(), B, T, heads, D, stride);
    return dot(y, r);
  };
  check_grad("dx", x, dx, f);
}

// Naive causal GQA attention in double.
std::vector<double> attention_ref(const std::vector<float>& q, const std::vector<float>& k,
                                  const std::vector<float>& v, int64_t B, int64_t T, int64_t H,
                                  int64_t KV, int64_t D) {
  std::vector<double> out(B * T * H * D);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kh = h / (H / KV);
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(i + 1);
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double d = 0;
          for (int64_t e = 0; e < D; ++e)
            d += static_cast<double>(q[(b * T + i) * H * D + h * D + e]) *
                 k[(b * T + j) * KV * D + kh * D + e];
          s[j] = d / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (auto& sj : s) z += (sj = std::exp(sj - mx));
        for (int64_t e = 0; e < D; ++e) {
          double o = 0;
          for (int64_t j = 0; j <= i; ++j) o += s[j] / z * v[(b * T + j) * KV * D + kh * D + e];
          out[(b * T + i) * H * D + h * D + e] = o;
        }
      }
    }
  return out;
}

void attention_case(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, int64_t stride) {
  auto q = randn(B * T * H * D, 1), k = randn(B * T * KV * D, 2), v = randn(B * T * KV * D, 3),
       r = randn(B * T * H * D, 4);
  std::vector<float> probs(B * H * T * T), out(B * T * H * D);
  attention_forward(q.data(), k.data(), v.data(), H * D, KV * D, probs.data(), out.data(), B, T, H,
                    KV, D);
  const auto ref = attention_ref(q, k, v, B, T, H, KV, D);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 1e-5) << i;

  std::vector<float> dq(q.size()), dk(k.size(), 9.0f), dv(v.size(), 9.0f);
  attention_backward(q.data(), k.data(), v.data(), H * D, KV * D, {}, probs.data(), r.data(),
                     dq.data(), dk.data(), dv.data(), B, T, H, KV, D);
  // Bit-identical on a second run.
  std::vector<float> dq2(q.size()), dk2(k.size()), dv2(v.size());
  attention_backward(q.data(), k.data(), v.data(), H * D, KV * D, {}, probs.data(), r.data(),
                     dq2.data(), dk2.data(), dv2.data(), B, T, H, KV, D);
  EXPECT_EQ(dq, dq2);
  EXPECT_EQ(dk, dk2);
  EXPECT_EQ(dv, dv2);

  auto f = [&] {
    attention_forward(q.data(), k.data(), v.data(), H * D, KV * D, probs.data(), out.data(), B, T,
                      H, KV, D);
    return dot(out, r);
  };
  check_grad("dq", q, dq, f, stride);
  check_grad("dk", k, dk, f, stride);
  check_grad("dv", v, dv, f, stride);
}

TEST(Ops, AttentionGqa) { attention_case(2, 5, 4, 2, 8, 1); }
TEST(Ops, AttentionMultiBlock) { attention_case(1, 70, 2, 1, 4, 7); }  // crosses the 64-row block
TEST(Ops, AttentionMha) { attention_case(1, 9, 3, 3, 6, 1); }

TEST(Ops, SwiGlu) {
  const int64_t n = 40;
  auto g = randn(n, 1, 2.0f), u = randn(n, 2), r = randn(n, 3);
  std::vector<float> out(n);
  swiglu_forward(g.data(), u.data(), n, out.data(), 1, n);
  for (int64_t i = 0; i < n; ++i)
    EXPECT_NEAR(out[i], g[i] / (1 + std::exp(-static_cast<double>(g[i]))) * u[i], 1e-5);
  std::vector<float> dg(n), du(n);
  swiglu_backward(g.data(), u.data(), n, r.data(), dg.data(), du.data(), 1, n);
  auto f = [&] {
    swiglu_forward(g.data(), u.data(), n, out.data(), 1, n);
    return dot(out, r);
  };
  check_grad("dgate", g, dg, f);
  check_grad("dup", u, du, f);
  // dup may alias dout.
  auto d = r;
  swiglu_backward(g.data(), u.data(), n, d.data(), dg.data(), d.data(), 1, n);
  EXPECT_EQ(d, du);
}

TEST(Ops, CrossEntropy) {
  const int64_t rows = 6, V = 11;
  auto z = randn(rows * V, 1, 3.0f);
  std::vector<int32_t> t = {3, -1, 0, 10, 5, -100};
  std::vector<float> lse(rows);
  int64_t count = 0;
  const double loss = cross_entropy_forward(z.data(), t.data(), lse.data(), rows, V, &count);
  EXPECT_EQ(count, 4);
  double ref = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (t[r] < 0) continue;
    double s = 0;
    for (int64_t j = 0; j < V; ++j) s += std::exp(static_cast<double>(z[r * V + j]));
    ref += std::log(s) - z[r * V + t[r]];
  }
  EXPECT_NEAR(loss, ref, 1e-5);

  const float scale = 0.7f;
  auto g = z;
  cross_entropy_backward(g.data(), t.data(), lse.data(), rows, V, scale);
  for (int64_t j = 0; j < V; ++j) EXPECT_EQ(g[1 * V + j], 0.0f);
  auto f = [&] {
    int64_t c;
    return scale * cross_entropy_forward(z.data(), t.data(), lse.data(), rows, V, &c);
  };
  check_grad("dlogits", z, g, f, 1, 2e-2, 1e-3, 1e-2f);

  std::vector<int32_t> bad = {0, 11, 0, 0, 0, 0};
  EXPECT_ANY_THROW(cross_entropy_forward(z.data(), bad.data(), lse.data(), rows, V, &count));
}

TEST(Ops, Embedding) {
  const int64_t rows = 7, dim = 5, V = 4;
  auto table = randn(V * dim, 1), dout = randn(rows * dim, 2);
  std::vector<int32_t> tok = {1, 3, 1, 0, 1, 3, 2};
  std::vector<float> out(rows * dim);
  embedding_forward(tok.data(), table.data(), out.data(), rows, dim);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < dim; ++j) EXPECT_EQ(out[r * dim + j], table[tok[r] * dim + j]);
  std::vector<float> dt(V * dim, 1.0f);
  embedding_backward(tok.data(), dout.data(), dt.data(), rows, dim);
  for (int64_t v = 0; v < V; ++v)
    for (int64_t j = 0; j < dim; ++j) {
      float ref = 1.0f;
      for (int64_t r = 0; r < rows; ++r)
        if (tok[r] == v) ref += dout[r * dim + j];
      EXPECT_EQ(dt[v * dim + j], ref);
    }
}

}  // namespace
}  // namespace amsp::kernels
