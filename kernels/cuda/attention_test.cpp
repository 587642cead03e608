// The CUDA attention kernels (kernels/cuda/attention.cu), run by the CPU
// emulation, against the CPU reference (kernels/cpu/attention.cpp): out, dq,
// dk and dv compared element by element, lse against a direct double-precision
// log-sum-exp (the CPU reference keeps probabilities, not lse). Shapes are
// chosen to be awkward for the tiles: T = 1, T not a multiple of the 16-row
// tile, head dims that are not multiples of a warp, GQA groups.
//
// Device memory is host memory in the emulation, so std::vector storage and the
// default (null) stream stand in for cudaMalloc and a stream; a launch runs when
// it is issued and a bad one throws (kernels/cuda/emu/simt.h), which fails the
// test, so no synchronisation or error query is needed.
//
// Tolerance. Both sides compute in fp32 but sum in different orders (sgemm
// blocks on the CPU; tiles, lane groups and shuffles here) and the kernel folds
// the softmax normalisation in at the end. Rounding errors of a sum of n terms
// of unit scale grow like u * sqrt(n) (u = 2^-24 ~ 6e-8) when they are random,
// and every result here is such a sum over the T keys or queries (times the
// group for dk, dv) of terms that are themselves dot products over D. So the
// error of each tensor, relative to its largest magnitude, is allowed
// kTolerance * sqrt(T * group + D): with kTolerance = 2e-6, ~30 u per sqrt-term,
// which leaves room for the fast_exp error (2 ulp) and the scale of the scores
// while a wrong mask or a lost rescale gives errors of 1e-3 and far more.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/common/math.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/emu/simt.h"
#include "kernels/cuda/ops.h"
#include "src/core/rng.h"

namespace amsp::kernels::cuda {
namespace {

constexpr double kTolerance = 2e-6;

struct Shape {
  int64_t B, T, H, KV, D;
};

std::vector<float> randn(int64_t n, uint64_t stream, float scale) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(random_normal(11, stream, i));
  return v;
}

std::vector<float> nans(int64_t n) {
  return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
}

// max |got - want| / max(max |want|, 1). The floor: inputs are of unit scale,
// and where every exact value is 0 (dq, dk at T = 1: a softmax over one key has
// no gradient) both sides return rounding residues of unit-scale terms. NaN
// counts as infinite, so unwritten elements show.
double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0, scale = 1;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
    const double e = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(e <= worst)) worst = std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
  }
  return worst / scale;
}

std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = round_bf16(x);
  return v;
}

// sqrt(mean (got - want)^2) / max(sqrt(mean want^2), 10^-3): how far the
// whole tensor is. The floor is for exact zeros (dq and dk at T = 1), where
// both sides leave rounding residues of unit-scale terms, about 10^-7.
double rms_error(const std::vector<float>& got, const std::vector<float>& want) {
  double e = 0, w = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    e += std::isnan(d) ? std::numeric_limits<double>::infinity() : d * d;
    w += static_cast<double>(want[i]) * want[i];
  }
  const double n = static_cast<double>(want.size());
  return std::sqrt(e / n) / std::max(std::sqrt(w / n), 1e-3);
}

constexpr double kBf16Roundoff = 0x1p-8;

// lse[b, h, t] = log sum_{j <= t} exp(q_t . k_j / sqrt(D)), in double.
std::vector<double> lse_ref(const std::vector<float>& q, const std::vector<float>& k,
                            const Shape& s) {
  std::vector<double> lse(s.B * s.H * s.T);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t t = 0; t < s.T; ++t) {
        const int64_t kh = h / (s.H / s.KV);
        std::vector<double> scores(t + 1);
        for (int64_t j = 0; j <= t; ++j) {
          double d = 0;
          for (int64_t e = 0; e < s.D; ++e)
            d += static_cast<double>(q[((b * s.T + t) * s.H + h) * s.D + e]) *
                 k[((b * s.T + j) * s.KV + kh) * s.D + e];
          scores[j] = d / std::sqrt(static_cast<double>(s.D));
        }
        const double mx = *std::max_element(scores.begin(), scores.end());
        double z = 0;
        for (double x : scores) z += std::exp(x - mx);
        lse[(b * s.H + h) * s.T + t] = mx + std::log(z);
      }
  return lse;
}

// What the device kernels give, run on q, k and v side by side in one buffer
// with rows [q | k | v], as the model's fused projection holds them (row
// strides ldq = ldkv = (H + 2 KV) D, dq, dk and dv written likewise), taken
// apart again. Activations A: float, or bf16 (the inputs rounded on the way
// in, the outputs widened on the way out). Outputs start as NaN: every
// element must be written.
struct Outputs {
  std::vector<float> lse, out, dq, dk, dv;
};

using bf16 = uint16_t;

template <typename A>
std::vector<A> stored(const std::vector<float>& x) {
  std::vector<A> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) store(&y[i], x[i]);
  return y;
}

template <typename A>
std::vector<float> widened(const A* x, int64_t n) {
  std::vector<float> y(n);
  for (int64_t i = 0; i < n; ++i) y[i] = load(x[i]);
  return y;
}

// The fused [B*T, (H + 2 KV) D] buffer starts `shift` elements into its
// allocation: 2 puts bf16 rows off the 16 bytes cp.async needs, so that the
// tensor-core kernels stage key tiles through registers instead. With rope
// tables backward rotates dq and dk back (q and k are taken as given).
template <typename A = float>
Outputs run_fused(const std::vector<float>& q, const std::vector<float>& k,
                  const std::vector<float>& v, const std::vector<float>& dout, const Shape& s,
                  bool bf16, Rotary rope = {}, int64_t shift = 0) {
  const int64_t N = s.B * s.T, lq = s.H * s.D, lk = s.KV * s.D, ld = lq + 2 * lk;
  std::vector<float> qkv32(N * ld);
  for (int64_t r = 0; r < N; ++r) {
    std::copy_n(q.begin() + r * lq, lq, qkv32.begin() + r * ld);
    std::copy_n(k.begin() + r * lk, lk, qkv32.begin() + r * ld + lq);
    std::copy_n(v.begin() + r * lk, lk, qkv32.begin() + r * ld + lq + lk);
  }
  qkv32.insert(qkv32.begin(), shift, 0.0f);
  const std::vector<A> qkv = stored<A>(qkv32), dout_a = stored<A>(dout);
  std::vector<A> dqkv = stored<A>(nans(N * ld)), out = stored<A>(nans(N * lq));
  Outputs d{nans(attention_saved_count(s.B, s.T, s.H)), {}, {}, {}, {}};
  auto work = nans(attention_backward_workspace(s.B, s.T, s.H, s.KV, s.D, bf16));
  const A* in = qkv.data() + shift;
  A* g = dqkv.data();
  attention_forward(in, in + lq, in + lq + lk, ld, ld, d.lse.data(), out.data(), s.B, s.T, s.H,
                    s.KV, s.D, bf16, nullptr);
  attention_backward(in, in + lq, in + lq + lk, ld, ld, rope, d.lse.data(), out.data(),
                     dout_a.data(), g, g + lq, g + lq + lk, work.data(), s.B, s.T, s.H, s.KV, s.D,
                     bf16, nullptr);
  d.out = widened(out.data(), N * lq);
  for (int64_t r = 0; r < N; ++r) {
    for (auto [dst, at, n] : {std::tuple{&d.dq, int64_t{0}, lq}, {&d.dk, lq, lk}, {&d.dv, lq + lk, lk}}) {
      const std::vector<float> row = widened(g + r * ld + at, n);
      dst->insert(dst->end(), row.begin(), row.end());
    }
  }
  return d;
}

// RoPE tables for the shape's T positions and head dim.
struct Tables {
  std::vector<float> cos, sin;
  Rotary rotary() const { return Rotary{cos.data(), sin.data()}; }
};

Tables tables_for(const Shape& s) {
  Tables t{std::vector<float>(s.T * s.D / 2), std::vector<float>(s.T * s.D / 2)};
  amsp::kernels::rope_table(t.cos.data(), t.sin.data(), s.T, s.D, 10000.0);
  return t;
}

// The separate pass (kernels/cpu/rope.cpp) over q or k rows [B*T, heads*D]:
// rotated (forward) or rotated back (backward), in fp32.
std::vector<float> rope_pass(std::vector<float> x, const Tables& t, const Shape& s, int64_t heads,
                             bool backward) {
  if (backward)
    amsp::kernels::rope_backward(x.data(), t.cos.data(), t.sin.data(), s.B, s.T, heads, s.D,
                                 heads * s.D);
  else
    amsp::kernels::rope_forward(x.data(), t.cos.data(), t.sin.data(), s.B, s.T, heads, s.D,
                                heads * s.D);
  return x;
}

// The CPU reference (kernels/cpu/attention.cpp) on q, k, v and dout in buffers
// of their own, rotating dq and dk back with tables; lse from lse_ref, since
// the reference keeps probabilities.
Outputs run_cpu(const std::vector<float>& q, const std::vector<float>& k,
                const std::vector<float>& v, const std::vector<float>& dout, const Shape& s,
                const Tables* rope = nullptr) {
  const int64_t nq = s.B * s.T * s.H * s.D, nk = s.B * s.T * s.KV * s.D;
  std::vector<float> probs(s.B * s.H * s.T * s.T);
  const std::vector<double> lse = lse_ref(q, k, s);
  const Rotary rotary = rope ? rope->rotary() : Rotary{};
  Outputs r{std::vector<float>(lse.begin(), lse.end()), std::vector<float>(nq),
            std::vector<float>(nq), std::vector<float>(nk), std::vector<float>(nk)};
  amsp::kernels::attention_forward(q.data(), k.data(), v.data(), s.H * s.D, s.KV * s.D,
                                   probs.data(), r.out.data(), s.B, s.T, s.H, s.KV, s.D);
  amsp::kernels::attention_backward(q.data(), k.data(), v.data(), s.H * s.D, s.KV * s.D, rotary,
                                    probs.data(), dout.data(), r.dq.data(), r.dk.data(),
                                    r.dv.data(), s.B, s.T, s.H, s.KV, s.D);
  return r;
}

// Every test runs with each block's threads resumed in two or three of the
// emulation's schedules (forward, reverse, lowest-first), so a missing barrier
// shows in one.
using amsp::emu::simt::Order;

std::string order_name(Order order) {
  return order == Order::kForward ? "forward" : order == Order::kReverse ? "reverse" : "lowest_first";
}

class CudaAttention : public ::testing::TestWithParam<std::tuple<Shape, Order>> {
 protected:
  void SetUp() override { amsp::emu::simt::set_order(std::get<1>(GetParam())); }
  void TearDown() override { amsp::emu::simt::set_order(Order::kForward); }
};

TEST_P(CudaAttention, MatchesCpuReference) {
  const Shape s = std::get<0>(GetParam());
  const int64_t nq = s.B * s.T * s.H * s.D, nk = s.B * s.T * s.KV * s.D;
  // q at twice the scale of k makes the softmax peaky enough that a lost
  // rescale of the running sum shows.
  const auto q = randn(nq, 1, 2.0f), k = randn(nk, 2, 1.0f), v = randn(nk, 3, 1.0f),
             dout = randn(nq, 4, 1.0f);
  const Outputs want = run_cpu(q, k, v, dout, s);
  const auto [lse, out, dq, dk, dv] = run_fused(q, k, v, dout, s, false);

  const double bound = kTolerance * std::sqrt(static_cast<double>(s.T * (s.H / s.KV) + s.D));
  const double e_out = relative_error(out, want.out), e_lse = relative_error(lse, want.lse),
               e_dq = relative_error(dq, want.dq), e_dk = relative_error(dk, want.dk),
               e_dv = relative_error(dv, want.dv);
  std::printf("  B=%lld T=%lld H=%lld KV=%lld D=%lld  relative error: out %.2e lse %.2e dq %.2e "
              "dk %.2e dv %.2e (bound %.2e)\n",
              static_cast<long long>(s.B), static_cast<long long>(s.T),
              static_cast<long long>(s.H), static_cast<long long>(s.KV),
              static_cast<long long>(s.D), e_out, e_lse, e_dq, e_dk, e_dv, bound);
  EXPECT_LE(e_out, bound);
  EXPECT_LE(e_lse, bound);
  EXPECT_LE(e_dq, bound);
  EXPECT_LE(e_dk, bound);
  EXPECT_LE(e_dv, bound);

  // Deterministic: a second run gives the same bits.
  const Outputs again = run_fused(q, k, v, dout, s, false);
  EXPECT_EQ(dq, again.dq);
  EXPECT_EQ(dk, again.dk);
  EXPECT_EQ(dv, again.dv);
}

// Every head dim from 1 to 256 launches (the emulation throws on more than 48
// KiB of shared memory, as CUDA would fail the launch) and, at T = 1, gives the
// answer it must: one visible key, so forward's p is exp(0) = 1 and out = v
// bit for bit; lse is the one score. Backward recomputes p = exp(score - lse)
// with the score summed in another order than forward's (the lane groups follow
// the tile size, which follows each kernel's shared memory), so p is 1 within
// rounding and dv = the group's dout summed within the bound of the shapes above.
class CudaAttentionHeadDims : public ::testing::TestWithParam<Order> {
 protected:
  void SetUp() override { amsp::emu::simt::set_order(GetParam()); }
  void TearDown() override { amsp::emu::simt::set_order(Order::kForward); }
};

TEST_P(CudaAttentionHeadDims, OneTokenEveryD) {
  for (int64_t D = 1; D <= 256; ++D) {
    const Shape s{1, 1, 2, 1, D};
    const auto q = randn(2 * D, 1, 1.0f), k = randn(D, 2, 1.0f), v = randn(D, 3, 1.0f),
               dout = randn(2 * D, 4, 1.0f);
    auto lse = nans(2), out = nans(2 * D), dq = nans(2 * D), dk = nans(D), dv = nans(D),
         work = nans(2);
    // q, k and v in buffers of their own here (row strides H D and KV D).
    attention_forward(q.data(), k.data(), v.data(), 2 * D, D, lse.data(), out.data(), s.B, s.T, s.H,
                      s.KV, s.D, false, nullptr);
    attention_backward(q.data(), k.data(), v.data(), 2 * D, D, {}, lse.data(), out.data(),
                       dout.data(), dq.data(), dk.data(), dv.data(), work.data(), s.B, s.T, s.H,
                       s.KV, s.D, false, nullptr);
    const auto want_lse = lse_ref(q, k, s);
    for (int64_t h = 0; h < 2; ++h) {
      EXPECT_NEAR(lse[h], want_lse[h], 1e-5 * (1 + std::fabs(want_lse[h]))) << "D " << D;
      for (int64_t d = 0; d < D; ++d) {
        ASSERT_EQ(out[h * D + d], v[d]) << "D " << D << " head " << h;
        // The two query heads share the kv head: dv = dout of head 0 + head 1.
        const float want_dv = dout[d] + dout[D + d];
        const double bound = kTolerance * std::sqrt(2.0 + D) * (1 + std::fabs(want_dv));
        if (h == 0) {
          ASSERT_NEAR(dv[d], want_dv, bound) << "D " << D;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Order, CudaAttentionHeadDims,
                         ::testing::Values(Order::kForward, Order::kReverse),
                         [](const ::testing::TestParamInfo<Order>& info) {
                           return order_name(info.param);
                         });

std::string case_name(const ::testing::TestParamInfo<std::tuple<Shape, Order>>& info) {
  const Shape& s = std::get<0>(info.param);
  // snprintf, not a chain of string +: GCC 12 warns (-Wrestrict) falsely on the chain.
  char name[96];
  std::snprintf(name, sizeof name, "B%lld_T%lld_H%lld_KV%lld_D%lld_%s", (long long)s.B,
                (long long)s.T, (long long)s.H, (long long)s.KV, (long long)s.D,
                std::string(order_name(std::get<1>(info.param))).c_str());
  return name;
}

// bf16 activations against fp32 activations holding the same (bf16) values,
// through the same kernels: forward's out is the fp32 one rounded once, bit for
// bit, and lse is the same bits. Backward's delta = rowsum(dout * out) reads
// the rounded out, and the gradients are rounded once: within 2u (rms) of the
// fp32 activations' (fp32 compute) or of the CPU reference on the same inputs
// (bf16 compute, whose own bounds are the test above's), and the same bits run
// after run.
void check_bf16_activations(const Shape& s, bool bf16_compute) {
  const int64_t nq = s.B * s.T * s.H * s.D, nk = s.B * s.T * s.KV * s.D;
  const auto q = rounded(randn(nq, 1, 2.0f)), k = rounded(randn(nk, 2, 1.0f)),
             v = rounded(randn(nk, 3, 1.0f)), dout = rounded(randn(nq, 4, 1.0f));
  const Outputs f = run_fused(q, k, v, dout, s, bf16_compute);
  const Outputs b = run_fused<bf16>(q, k, v, dout, s, bf16_compute);
  EXPECT_EQ(b.out, rounded(f.out));
  EXPECT_EQ(b.lse, f.lse);
  const Outputs ref = bf16_compute ? run_cpu(q, k, v, dout, s) : f;
  std::printf("  bf16 activations: rms error dq %.2e dk %.2e dv %.2e\n", rms_error(b.dq, ref.dq),
              rms_error(b.dk, ref.dk), rms_error(b.dv, ref.dv));
  EXPECT_LE(rms_error(b.dq, ref.dq), 2 * kBf16Roundoff);
  EXPECT_LE(rms_error(b.dk, ref.dk), 2 * kBf16Roundoff);
  EXPECT_LE(rms_error(b.dv, ref.dv), 2 * kBf16Roundoff);
  const Outputs again = run_fused<bf16>(q, k, v, dout, s, bf16_compute);
  EXPECT_EQ(b.dq, again.dq);
  EXPECT_EQ(b.dk, again.dk);
  EXPECT_EQ(b.dv, again.dv);
}

// On the fp32 kernels (fp32 compute).
TEST_P(CudaAttention, Bf16ActivationsAreFp32OnesRounded) {
  check_bf16_activations(std::get<0>(GetParam()), false);
}

// B, T, H, KV, D
const Shape kShapes[] = {
    {1, 1, 1, 1, 8},     // one token
    {3, 1, 8, 2, 64},    // one token, GQA
    {1, 37, 1, 1, 8},    // T not a tile multiple
    {3, 37, 4, 4, 24},   // D not a warp multiple
    {1, 130, 8, 2, 64},  // GQA, T past 8 tiles
    {3, 130, 4, 4, 128}, // 16-row tiles backward
    {1, 37, 8, 2, 128},  // GQA at D = 128
    {2, 50, 4, 2, 96},   // D = 3 warps
    {1, 37, 2, 1, 256},  // largest D, 4-row tiles
    {2, 19, 1, 1, 1},    // D = 1
};

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention,
                         ::testing::Combine(::testing::ValuesIn(kShapes),
                                            ::testing::Values(Order::kForward, Order::kReverse)),
                         case_name);

// With rope tables backward rotates dq and dk back as it writes them (q and k
// come rotated, as the model's rope_forward leaves them): on fp32 activations
// that is the separate pass after it, to the bit (the same rotation of the
// same values, in fp32: rope_rotate leaves the compiler no multiply-add to
// choose), dv is untouched; and it is what the CPU reference rotating back
// gives, within the bound above.
class CudaAttentionRope : public CudaAttention {};

TEST_P(CudaAttentionRope, RotatesGradientsBack) {
  const Shape s = std::get<0>(GetParam());
  const int64_t nq = s.B * s.T * s.H * s.D, nk = s.B * s.T * s.KV * s.D;
  const Tables t = tables_for(s);
  const auto q = rope_pass(randn(nq, 1, 2.0f), t, s, s.H, false),
             k = rope_pass(randn(nk, 2, 1.0f), t, s, s.KV, false), v = randn(nk, 3, 1.0f),
             dout = randn(nq, 4, 1.0f);
  const Outputs fused = run_fused(q, k, v, dout, s, false, t.rotary());
  Outputs apart = run_fused(q, k, v, dout, s, false);
  apart.dq = rope_pass(apart.dq, t, s, s.H, true);
  apart.dk = rope_pass(apart.dk, t, s, s.KV, true);
  EXPECT_EQ(fused.dq, apart.dq);
  EXPECT_EQ(fused.dk, apart.dk);
  EXPECT_EQ(fused.dv, apart.dv);

  const Outputs want = run_cpu(q, k, v, dout, s, &t);
  const double bound = kTolerance * std::sqrt(static_cast<double>(s.T * (s.H / s.KV) + s.D));
  EXPECT_LE(relative_error(fused.out, want.out), bound);
  EXPECT_LE(relative_error(fused.lse, want.lse), bound);
  EXPECT_LE(relative_error(fused.dq, want.dq), bound);
  EXPECT_LE(relative_error(fused.dk, want.dk), bound);
  EXPECT_LE(relative_error(fused.dv, want.dv), bound);
}

// Even head dims (RoPE rotates pairs), both paths' tile shapes.
const Shape kRopeShapes[] = {
    {3, 1, 8, 2, 64},   {1, 37, 1, 1, 8},  {3, 37, 4, 4, 24},
    {1, 130, 8, 2, 64}, {2, 50, 4, 2, 96}, {1, 37, 2, 1, 256},
};

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionRope,
                         ::testing::Combine(::testing::ValuesIn(kRopeShapes),
                                            ::testing::Values(Order::kForward, Order::kReverse)),
                         case_name);

// attention with bf16 (attention_bf16.cu's tensor cores) against the same CPU reference run
// on the inputs rounded to bf16, as the kernels round them when they load
// them. What remains is the kernels' rounding of the probabilities and of
// their gradients to bf16 before the products that take them (u = 2^-8, the
// unit roundoff of bf16's 8-bit significand):
//   - lse: the row sum of rounded probabilities is within u of the exact one
//     relative to itself, so lse is within u (absolute) of log of it;
//   - out = sum_j p~_j v_j / sum_j p~_j moves by sum_j p_j d_j (v_j - out) / l
//     with |d_j| <= u: at most 2 u max |v| anywhere;
//   - every output (out, dq, dk, dv) is a sum of terms each carrying one such
//     rounding of its weight (p, or dS = p (dP - delta)), with the random
//     signs of the inputs, so that the error is a sum of the same terms scaled
//     by d_j: its root mean square is at most u / sqrt(3) (rounding errors
//     spread evenly over [-u, u]) of the output's, plus the row factor lse
//     carries into backward's p (u / sqrt(keys) in the mean). The tests allow
//     u; a lost rescale, a wrong mask or a missing tile moves the outputs by
//     10^-2 and more.


class CudaAttentionBf16 : public CudaAttention {};

TEST_P(CudaAttentionBf16, MatchesCpuReferenceOnBf16Inputs) {
  const Shape s = std::get<0>(GetParam());
  const int64_t nq = s.B * s.T * s.H * s.D, nk = s.B * s.T * s.KV * s.D;
  const auto q = randn(nq, 1, 2.0f), k = randn(nk, 2, 1.0f), v = randn(nk, 3, 1.0f),
             dout = randn(nq, 4, 1.0f);
  const auto vr = rounded(v);
  const Outputs want = run_cpu(rounded(q), rounded(k), vr, rounded(dout), s);
  const auto [lse, out, dq, dk, dv] = run_fused(q, k, v, dout, s, true);
  std::printf("  B=%lld T=%lld H=%lld KV=%lld D=%lld  max error: out %.2e lse %.2e dq %.2e "
              "dk %.2e dv %.2e; rms: out %.2e dq %.2e dk %.2e dv %.2e\n",
              (long long)s.B, (long long)s.T, (long long)s.H, (long long)s.KV, (long long)s.D,
              relative_error(out, want.out), relative_error(lse, want.lse),
              relative_error(dq, want.dq), relative_error(dk, want.dk), relative_error(dv, want.dv),
              rms_error(out, want.out), rms_error(dq, want.dq), rms_error(dk, want.dk),
              rms_error(dv, want.dv));
  const double max_v = std::fabs(*std::max_element(vr.begin(), vr.end(), [](float a, float b) {
    return std::fabs(a) < std::fabs(b);
  }));
  EXPECT_LE(relative_error(lse, want.lse), kBf16Roundoff);
  EXPECT_LE(relative_error(out, want.out), 2 * kBf16Roundoff * max_v);
  EXPECT_LE(rms_error(out, want.out), kBf16Roundoff);
  EXPECT_LE(rms_error(dq, want.dq), kBf16Roundoff);
  EXPECT_LE(rms_error(dk, want.dk), kBf16Roundoff);
  EXPECT_LE(rms_error(dv, want.dv), kBf16Roundoff);

  const Outputs again = run_fused(q, k, v, dout, s, true);
  EXPECT_EQ(dq, again.dq);
  EXPECT_EQ(dk, again.dk);
  EXPECT_EQ(dv, again.dv);
}

// On tensor cores (bf16 compute), read as they are (the same words the fp32
// path makes by rounding), against the CPU reference on the same inputs.
TEST_P(CudaAttentionBf16, Bf16ActivationsAreFp32OnesRounded) {
  check_bf16_activations(std::get<0>(GetParam()), true);
}

// B, T, H, KV, D: every head dim the tensor cores take, T from one token to
// past three 64-row tiles and off the tile boundaries; and two head dims they
// do not take (8, 24), which run the fp32 kernels on the rounded inputs.
const Shape kBf16Shapes[] = {
    {1, 37, 4, 2, 8},    {2, 50, 2, 2, 24},
    {1, 1, 1, 1, 16},    {3, 1, 8, 2, 64},    {2, 37, 4, 4, 16},  {1, 70, 8, 2, 32},
    {1, 130, 4, 2, 64},  {2, 50, 2, 1, 128},  {1, 200, 2, 2, 48}, {1, 129, 4, 4, 96},
    {1, 65, 2, 1, 80},   {1, 64, 2, 2, 112},
};

// All three schedules: in lowest-first the first warp runs ahead to the next
// tile's loads, which is what the barrier before them is for.
INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionBf16,
                         ::testing::Combine(::testing::ValuesIn(kBf16Shapes),
                                            ::testing::Values(Order::kForward, Order::kReverse,
                                                              Order::kLowestFirst)),
                         case_name);

// On bf16 activations with bf16 compute (the tensor cores for D a multiple of
// 16, the fp32 kernels on rounded values for 8 and 24), with rope tables: dv
// is the same bits as without. dq and dk are rotated back before their one
// rounding, where the pass after attention rounds them, rotates them back and
// rounds again: within one bf16 unit (rms) of the pass's, without the second
// rounding.
class CudaAttentionBf16Rope : public CudaAttention {};

TEST_P(CudaAttentionBf16Rope, RotatesGradientsBack) {
  const Shape s = std::get<0>(GetParam());
  const int64_t nq = s.B * s.T * s.H * s.D, nk = s.B * s.T * s.KV * s.D;
  const Tables t = tables_for(s);
  const auto q = rounded(rope_pass(randn(nq, 1, 2.0f), t, s, s.H, false)),
             k = rounded(rope_pass(randn(nk, 2, 1.0f), t, s, s.KV, false)),
             v = rounded(randn(nk, 3, 1.0f)), dout = rounded(randn(nq, 4, 1.0f));
  const Outputs fused = run_fused<bf16>(q, k, v, dout, s, true, t.rotary());
  const Outputs apart = run_fused<bf16>(q, k, v, dout, s, true);
  EXPECT_EQ(fused.dv, apart.dv);
  const auto dq = rope_pass(apart.dq, t, s, s.H, true), dk = rope_pass(apart.dk, t, s, s.KV, true);
  std::printf("  rms error against the pass, rotated back unrounded: dq %.2e dk %.2e\n",
              rms_error(fused.dq, dq), rms_error(fused.dk, dk));
  EXPECT_LE(rms_error(fused.dq, dq), kBf16Roundoff);
  EXPECT_LE(rms_error(fused.dk, dk), kBf16Roundoff);
  const Outputs again = run_fused<bf16>(q, k, v, dout, s, true, t.rotary());
  EXPECT_EQ(fused.dq, again.dq);
  EXPECT_EQ(fused.dk, again.dk);
}

// Key tiles copied by cp.async (rows 16-byte aligned) and staged through
// registers (rows 4 bytes off): the same tiles, so the same bits, with dq and
// dk rotated back on both paths.
TEST_P(CudaAttentionBf16Rope, UnalignedRowsGiveTheSameBits) {
  const Shape s = std::get<0>(GetParam());
  const int64_t nq = s.B * s.T * s.H * s.D, nk = s.B * s.T * s.KV * s.D;
  const auto q = randn(nq, 1, 2.0f), k = randn(nk, 2, 1.0f), v = randn(nk, 3, 1.0f),
             dout = randn(nq, 4, 1.0f);
  const Tables t = tables_for(s);
  const Outputs aligned = run_fused<bf16>(q, k, v, dout, s, true, t.rotary());
  const Outputs shifted = run_fused<bf16>(q, k, v, dout, s, true, t.rotary(), 2);
  EXPECT_EQ(aligned.lse, shifted.lse);
  EXPECT_EQ(aligned.out, shifted.out);
  EXPECT_EQ(aligned.dq, shifted.dq);
  EXPECT_EQ(aligned.dk, shifted.dk);
  EXPECT_EQ(aligned.dv, shifted.dv);
}

// Where the device lets a kernel opt in to no more than 48 KiB of shared
// memory (a GPU smaller than an A100), forward and dq take one key tile at a
// time and dk/dv stages its query tiles through registers, above D = 80
// (attention_bf16.cu: shared_fits): the same rows summed in the same order, so
// the same bits as the two-tile variants the emulated A100 runs.
TEST(CudaAttentionSharedMemory, OneTileAtATimeOnASmallerGpuGivesTheSameBits) {
  for (const Shape& s :
       {Shape{1, 130, 4, 2, 128}, Shape{2, 50, 2, 1, 96}, Shape{1, 65, 2, 1, 112}}) {
    const int64_t nq = s.B * s.T * s.H * s.D, nk = s.B * s.T * s.KV * s.D;
    const Tables t = tables_for(s);
    const auto q = randn(nq, 1, 2.0f), k = randn(nk, 2, 1.0f), v = randn(nk, 3, 1.0f),
               dout = randn(nq, 4, 1.0f);
    const Outputs two = run_fused<bf16>(q, k, v, dout, s, true, t.rotary());
    amsp::emu::simt::set_device_shared_optin(48 * 1024);
    const Outputs one = run_fused<bf16>(q, k, v, dout, s, true, t.rotary());
    amsp::emu::simt::set_device_shared_optin(0);
    SCOPED_TRACE("T " + std::to_string(s.T) + ", D " + std::to_string(s.D));
    EXPECT_EQ(two.lse, one.lse);
    EXPECT_EQ(two.out, one.out);
    EXPECT_EQ(two.dq, one.dq);
    EXPECT_EQ(two.dk, one.dk);
    EXPECT_EQ(two.dv, one.dv);
  }
}

// Up to D = 64 forward and dq take two tiles of 16 query rows a warp and
// dk/dv two tiles of 16 keys where asked (attention_bf16.cu); one tile a warp,
// the default since an H200 ran it faster, and two stay selectable so that a
// GPU can time both. Each row and key sums
// the same products in the same order either way: the same bits, with
// grouped-query heads, ragged T and dq and dk rotated back.
TEST(CudaAttentionWarpTiles, OneTileAWarpGivesTheSameBitsAsTwo) {
  ASSERT_EQ(attention_warp_tiles(), 1);
  for (const Shape& s : {Shape{1, 130, 4, 2, 64}, Shape{2, 70, 2, 1, 32}, Shape{1, 200, 2, 2, 48},
                         Shape{1, 37, 4, 4, 16}}) {
    const int64_t nq = s.B * s.T * s.H * s.D, nk = s.B * s.T * s.KV * s.D;
    const Tables t = tables_for(s);
    const auto q = randn(nq, 1, 2.0f), k = randn(nk, 2, 1.0f), v = randn(nk, 3, 1.0f),
               dout = randn(nq, 4, 1.0f);
    const uint64_t b0 = amsp::emu::simt::blocks_launched();
    set_attention_warp_tiles(2);
    const Outputs two = run_fused<bf16>(q, k, v, dout, s, true, t.rotary());
    set_attention_warp_tiles(1);
    const uint64_t b1 = amsp::emu::simt::blocks_launched();
    const Outputs one = run_fused<bf16>(q, k, v, dout, s, true, t.rotary());
    const uint64_t b2 = amsp::emu::simt::blocks_launched();
    SCOPED_TRACE("T " + std::to_string(s.T) + ", D " + std::to_string(s.D));
    if (s.T > 64)  // more than one block of 64 rows a head: 128-row blocks are fewer
      EXPECT_LT(b1 - b0, b2 - b1) << "two tiles a warp: blocks of 128 rows, fewer than of 64";
    EXPECT_EQ(two.lse, one.lse);
    EXPECT_EQ(two.out, one.out);
    EXPECT_EQ(two.dq, one.dq);
    EXPECT_EQ(two.dk, one.dk);
    EXPECT_EQ(two.dv, one.dv);
  }
}

const Shape kBf16RopeShapes[] = {
    {1, 37, 4, 2, 8},   {2, 50, 2, 2, 24},  {3, 1, 8, 2, 64},   {1, 70, 8, 2, 32},
    {1, 130, 4, 2, 64}, {2, 50, 2, 1, 128}, {1, 200, 2, 2, 48}, {1, 65, 2, 1, 80},
};

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionBf16Rope,
                         ::testing::Combine(::testing::ValuesIn(kBf16RopeShapes),
                                            ::testing::Values(Order::kForward,
                                                              Order::kLowestFirst)),
                         case_name);

}  // namespace
}  // namespace amsp::kernels::cuda
