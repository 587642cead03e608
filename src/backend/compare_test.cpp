// The comparison harness itself: a backend compared with an equal one agrees
// exactly; a backend that is wrong in one kernel fails on that kernel's rows
// and no others; and the tolerances are the numbers doc/gpu.md derives.
#include "backend/compare.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>
#include <sstream>
#include <vector>

#include "backend/compare_tolerance.h"
#include "backend/stream_timer.h"
#include "core/error.h"
#include "kernels/common/math.h"

namespace amsp::backend {
namespace {

// A backend that forwards every call to another: the base of the wrong ones.
class Forwarding : public Backend {
 public:
  explicit Forwarding(DType compute) : Backend(compute), in_(make_cpu_backend(compute)) {}
  Device device() const override { return in_->device(); }
  std::string describe() const override { return "wrong " + in_->describe(); }
  Buffer alloc(DType t, int64_t n) override { return in_->alloc(t, n); }
  MemoryStats memory() const override { return in_->memory(); }
  int64_t device_memory_free() const override { return in_->device_memory_free(); }
  Buffer alloc_host(int64_t n) override { return in_->alloc_host(n); }
  void to_host(const View& s, float* d) override { in_->to_host(s, d); }
  void to_host(const View& s, int32_t* d) override { in_->to_host(s, d); }
  void from_host(const float* s, const View& d) override { in_->from_host(s, d); }
  void from_host(const int32_t* s, const View& d) override { in_->from_host(s, d); }
  Event record() override { return in_->record(); }
  void wait(const Event& e) override { in_->wait(e); }
  void synchronize() override { in_->synchronize(); }
  void begin_snapshot(const std::vector<HostCopy>& c) override { in_->begin_snapshot(c); }
  void fence_snapshot() override { in_->fence_snapshot(); }
  void wait_snapshot() override { in_->wait_snapshot(); }
  std::unique_ptr<comm::Communicator> make_communicator(comm::Group g) override {
    return in_->make_communicator(std::move(g));
  }
  void fill_zero(const View& x) override { in_->fill_zero(x); }
  void copy(const View& s, const View& d) override { in_->copy(s, d); }
  void add(const View& d, const View& s) override { in_->add(d, s); }
  double sum_squares(const View& x) override { return in_->sum_squares(x); }
  void quantize(const View& s, int64_t n, int64_t r, const View& d,
                const kernels::quant::Spec& spec) override {
    in_->quantize(s, n, r, d, spec);
  }
  void dequantize(const View& s, int64_t n, int64_t r, const View& d,
                  const kernels::quant::Spec& spec) override {
    in_->dequantize(s, n, r, d, spec);
  }
  void dequantize_sum(const View& s, int64_t n, int64_t r, const View& d,
                      const kernels::quant::Spec& spec) override {
    in_->dequantize_sum(s, n, r, d, spec);
  }
  void embedding_forward(const View& t, const View& w, const View& o, int64_t r, int64_t d) override {
    in_->embedding_forward(t, w, o, r, d);
  }
  void embedding_backward(const View& t, const View& g, const View& w, int64_t r, int64_t d) override {
    in_->embedding_backward(t, g, w, r, d);
  }
  void linear_forward(const View& x, const View& w, const View& y, int64_t M, int64_t in,
                      int64_t out, float beta) override {
    in_->linear_forward(x, w, y, M, in, out, beta);
  }
  void linear_forward_residual(const View& x, const View& w, const View& r, const View& y,
                               int64_t M, int64_t in, int64_t out) override {
    in_->linear_forward_residual(x, w, r, y, M, in, out);
  }
  void linear_backward_input(const View& dy, const View& w, const View& dx, int64_t M, int64_t in,
                             int64_t out, float beta) override {
    in_->linear_backward_input(dy, w, dx, M, in, out, beta);
  }
  void linear_backward_weight(const View& dy, const View& x, const View& dw, int64_t M, int64_t in,
                              int64_t out, float beta) override {
    in_->linear_backward_weight(dy, x, dw, M, in, out, beta);
  }
  void rmsnorm_forward(const View& x, const View& w, const View& y, const View& inv, int64_t rows,
                       int64_t dim, float eps) override {
    in_->rmsnorm_forward(x, w, y, inv, rows, dim, eps);
  }
  void rmsnorm_apply(const View& x, const View& w, const View& inv, const View& y, int64_t rows,
                     int64_t dim) override {
    in_->rmsnorm_apply(x, w, inv, y, rows, dim);
  }
  void rmsnorm_backward(const View& dy, const View& x, const View& w, const View& inv,
                        const View& dx, const View& dw, int64_t rows, int64_t dim,
                        const View& dx_bf16, float dw_beta) override {
    in_->rmsnorm_backward(dy, x, w, inv, dx, dw, rows, dim, dx_bf16, dw_beta);
  }
  void rope_table(const View& c, const View& s, int64_t T, int64_t hd, double theta) override {
    in_->rope_table(c, s, T, hd, theta);
  }
  void rope_forward(const View& x, const View& c, const View& s, int64_t B, int64_t T,
                    int64_t heads, int64_t hd, int64_t stride) override {
    in_->rope_forward(x, c, s, B, T, heads, hd, stride);
  }
  void rope_backward(const View& x, const View& c, const View& s, int64_t B, int64_t T,
                     int64_t heads, int64_t hd, int64_t stride) override {
    in_->rope_backward(x, c, s, B, T, heads, hd, stride);
  }
  int64_t attention_saved_count(int64_t B, int64_t T, int64_t H) const override {
    return in_->attention_saved_count(B, T, H);
  }
  void attention_forward(const View& qkv, const View& saved, const View& out, int64_t B, int64_t T,
                         int64_t H, int64_t KV, int64_t D) override {
    in_->attention_forward(qkv, saved, out, B, T, H, KV, D);
  }
  void attention_backward(const View& qkv, const RopeTables& rope, const View& saved,
                          const View& out, const View& dout, const View& dqkv, int64_t B, int64_t T,
                          int64_t H, int64_t KV, int64_t D) override {
    in_->attention_backward(qkv, rope, saved, out, dout, dqkv, B, T, H, KV, D);
  }
  void swiglu_forward(const View& gu, const View& o, int64_t rows, int64_t I) override {
    in_->swiglu_forward(gu, o, rows, I);
  }
  void swiglu_backward(const View& gu, const View& d, const View& dgu, int64_t rows,
                       int64_t I) override {
    in_->swiglu_backward(gu, d, dgu, rows, I);
  }
  LossSum cross_entropy_forward(const View& z, const View& t, const View& lse, int64_t rows,
                                int64_t V) override {
    return in_->cross_entropy_forward(z, t, lse, rows, V);
  }
  void cross_entropy_forward_into(const View& z, const View& t, const View& lse, int64_t rows, int64_t V,
                                  const View& acc) override {
    in_->cross_entropy_forward_into(z, t, lse, rows, V, acc);
  }
  void from_host_async(const int32_t* src, const View& dst) override { in_->from_host_async(src, dst); }
  void to_host_f64(const View& src, double* dst) override { in_->to_host_f64(src, dst); }
  void sum_squares_into(const View& x, const View& acc) override { in_->sum_squares_into(x, acc); }
  void clip_scale(const View& sumsq, double divisor, double max_norm, const View& scale) override {
    in_->clip_scale(sumsq, divisor, max_norm, scale);
  }
  void cross_entropy_backward(const View& z, const View& t, const View& lse, int64_t rows,
                              int64_t V, float scale) override {
    in_->cross_entropy_backward(z, t, lse, rows, V, scale);
  }
  void adamw(const View& p, const View& m, const View& v, const View& g, const View& copy,
             const AdamWStep& s) override {
    in_->adamw(p, m, v, g, copy, s);
  }
  // In place, part by part through adamw, so that a fake's adamw sees each.
  void adamw_parts(const std::vector<AdamWPart>& parts, const AdamWStep& step) override {
    AdamWStep s = step;
    for (const AdamWPart& p : parts) {
      if (p.out_of_place()) {
        in_->adamw_parts({p}, step);
        continue;
      }
      s.weight_decay = p.weight_decay;
      adamw(p.master, p.m, p.v, p.grad, p.param_copy, s);
    }
  }
  double peak_flops() override { return in_->peak_flops(); }
  std::unique_ptr<StreamTimer> make_stream_timer() override { return in_->make_stream_timer(); }

 protected:
  std::unique_ptr<Backend> in_;
};

// linear_forward one bf16 ulp off in the output's largest element: what a
// bf16 rounding where fp32 was promised would do to one element.
class OneUlpLinear : public Forwarding {
 public:
  using Forwarding::Forwarding;
  void linear_forward(const View& x, const View& w, const View& y, int64_t M, int64_t in,
                      int64_t out, float beta) override {
    in_->linear_forward(x, w, y, M, in, out, beta);
    float* p = y.f32();
    float* big = std::max_element(p, p + M * out, [](float a, float b) { return std::fabs(a) < std::fabs(b); });
    *big += std::ldexp(1.0f, std::ilogb(*big) - 7);
  }
};

// attention_forward that leaves out the first key of each sequence for every
// query row but the first (which sees nothing else): a mask that starts one key
// late. Rows 1..T-1 are recomputed as a sequence of their own, one shorter:
// causal attention depends only on the keys' order, so each of those rows then
// sees keys 1..t. Row 1 loses half its weights, a difference no tolerance of
// the checks hides, even bf16 activations'.
class DropsFirstKey : public Forwarding {
 public:
  using Forwarding::Forwarding;
  void attention_forward(const View& qkv, const View& saved, const View& out, int64_t B, int64_t T,
                         int64_t H, int64_t KV, int64_t D) override {
    in_->attention_forward(qkv, saved, out, B, T, H, KV, D);
    if (T < 2) return;
    const int64_t lq = H * D, row = (H + 2 * KV) * D, n = T - 1;
    Buffer qkv1 = in_->alloc(qkv.dtype, n * row), o1 = in_->alloc(out.dtype, n * lq);
    Buffer saved1 = in_->alloc(DType::kF32, in_->attention_saved_count(1, n, H));
    for (int64_t b = 0; b < B; ++b) {
      in_->copy(qkv.at((b * T + 1) * row, n * row), qkv1.view());
      in_->attention_forward(qkv1.view(), saved1.view(), o1.view(), 1, n, H, KV, D);
      in_->copy(o1.view(), out.at((b * T + 1) * lq, n * lq));
    }
  }
};

// adamw whose bf16 parameter copy lands on the neighbouring bf16 value in its
// largest element, as a GPU's fused multiply-adds may make it do now and then:
// not a bug, and not a failure.
class CopyOneUlpOver : public Forwarding {
 public:
  using Forwarding::Forwarding;
  void adamw(const View& p, const View& m, const View& v, const View& g, const View& copy,
             const AdamWStep& s) override {
    in_->adamw(p, m, v, g, copy, s);
    uint16_t* c = copy.bf16();
    uint16_t* big = std::max_element(c, c + copy.count, [](uint16_t a, uint16_t b) {
      return (a & 0x7fff) < (b & 0x7fff);
    });
    *big += 1;  // the next bf16 away from zero
  }
};

// dequantize_sum one ulp off in its largest element: what a fused multiply-add
// where two roundings were promised would do to one element.
class FusedQuantSum : public Forwarding {
 public:
  using Forwarding::Forwarding;
  void dequantize_sum(const View& s, int64_t n, int64_t r, const View& d,
                      const kernels::quant::Spec& spec) override {
    in_->dequantize_sum(s, n, r, d, spec);
    if (n == 0) return;
    if (d.dtype == DType::kBF16) {
      uint16_t* p = d.bf16();
      *std::max_element(p, p + n, [](uint16_t a, uint16_t b) { return (a & 0x7fff) < (b & 0x7fff); }) += 1;
      return;
    }
    float* p = d.f32();
    float* big = std::max_element(p, p + n, [](float a, float b) { return std::fabs(a) < std::fabs(b); });
    *big = std::nextafter(*big, 2 * *big);
  }
};

// The (kernel, output) pairs of the failing rows.
std::set<std::pair<std::string, std::string>> failing(const CompareReport& r) {
  std::set<std::pair<std::string, std::string>> f;
  for (const CompareRow& row : r.rows)
    if (!row.ok()) f.emplace(row.kernel, row.output);
  return f;
}

TEST(BackendCompare, TheCpuBackendAgainstItselfIsExact) {
  for (DType compute : {DType::kF32, DType::kBF16}) {
    auto a = make_cpu_backend(compute), b = make_cpu_backend(compute);
    const CompareReport report = compare_backends(*a, *b);
    EXPECT_TRUE(report.ok());
    EXPECT_GT(report.rows.size(), 100u);
    for (const CompareRow& r : report.rows) EXPECT_EQ(r.error, 0) << r.kernel << " " << r.shape;
    std::ostringstream out;
    print_report(report, out);
    EXPECT_NE(out.str().find("attention_forward+backward"), std::string::npos) << out.str();
    EXPECT_NE(out.str().find("all within tolerance"), std::string::npos) << out.str();
  }
}

// layer-mini runs the small cases and then the layer cases, divided.
TEST(BackendCompare, LayerMiniAddsTheLayerCases) {
  auto a = make_cpu_backend(DType::kF32), b = make_cpu_backend(DType::kF32);
  const size_t small = compare_backends(*a, *b).rows.size();
  const CompareReport report = compare_backends(*a, *b, Shapes::kLayerMini);
  EXPECT_TRUE(report.ok());
  EXPECT_GT(report.rows.size(), small + 60);
  auto has = [&](const std::string& shape) {
    return std::any_of(report.rows.begin(), report.rows.end(),
                       [&](const CompareRow& r) { return r.shape == shape; });
  };
  EXPECT_TRUE(has("M=256 in=352 out=128 w=fp32 beta=1"));  // 1B down, divided by 16
  EXPECT_TRUE(has("B=1 T=256 H=8 KV=2 D=32"));              // 7B attention at T 4096 / 16
  EXPECT_TRUE(has("rows=256 V=2000"));
}

TEST(BackendCompare, OneBf16UlpInOneLinearOutputFailsExactlyThatKernel) {
  auto a = make_cpu_backend(DType::kF32);
  OneUlpLinear wrong(DType::kF32);
  const CompareReport report = compare_backends(*a, wrong);
  EXPECT_FALSE(report.ok());
  for (const CompareRow& r : report.rows)
    EXPECT_EQ(r.ok(), r.kernel != "linear_forward") << r.kernel << " " << r.shape << " " << r.error;
  std::ostringstream out;
  print_report(report, out);
  EXPECT_NE(out.str().find("failing:"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find(" outputs outside tolerance"), std::string::npos) << out.str();
}

// Quantization must be bit for bit: one ulp in one summed value fails its rows, every one.
TEST(BackendCompare, OneUlpInOneQuantizedSumFailsExactlyThatOutput) {
  auto a = make_cpu_backend(DType::kF32);
  FusedQuantSum wrong(DType::kF32);
  const CompareReport report = compare_backends(*a, wrong);
  const std::set<std::pair<std::string, std::string>> want{
      {"quantize, dequantize, dequantize_sum", "dequantize_sum"}};
  EXPECT_EQ(failing(report), want);
  int rows = 0;
  for (const CompareRow& r : report.rows) {
    if (r.output != "dequantize_sum") continue;
    EXPECT_FALSE(r.ok()) << r.shape;
    ++rows;
  }
  EXPECT_EQ(rows, 4);
}

TEST(BackendCompare, AttentionThatDropsAKeyFailsExactlyItsOutput) {
  for (DType compute : {DType::kF32, DType::kBF16}) {
    auto a = make_cpu_backend(compute);
    DropsFirstKey wrong(compute);
    const CompareReport report = compare_backends(*a, wrong);
    const std::set<std::pair<std::string, std::string>> want{{"attention_forward+backward", "out"}};
    EXPECT_EQ(failing(report), want);
    // Every case with a key to drop fails; T = 1 has none.
    for (const CompareRow& r : report.rows)
      if (r.output == "out" && r.kernel == "attention_forward+backward")
        EXPECT_EQ(r.ok(), r.shape.find("T=1 ") != std::string::npos) << r.shape << " " << r.error;
  }
}

TEST(BackendCompare, AParamCopyOnTheNeighbouringBf16ValuePasses) {
  auto a = make_cpu_backend(DType::kF32);
  CopyOneUlpOver flipped(DType::kF32);
  const CompareReport report = compare_backends(*a, flipped);
  EXPECT_TRUE(report.ok());
  double worst = 0;
  for (const CompareRow& r : report.rows)
    if (r.output == "param copy") worst = std::max(worst, r.error);
  EXPECT_GT(worst, 0x1p-9);  // the flip is there, and tolerated
}

TEST(BackendCompare, BackendsMustComputeInOneDtype) {
  auto a = make_cpu_backend(DType::kF32), b = make_cpu_backend(DType::kBF16);
  EXPECT_THROW(compare_backends(*a, *b), Error);
}

TEST(BackendCompare, ShapesParse) {
  EXPECT_EQ(parse_shapes("small"), Shapes::kSmall);
  EXPECT_EQ(parse_shapes("layer"), Shapes::kLayer);
  EXPECT_EQ(parse_shapes("layer-mini"), Shapes::kLayerMini);
  EXPECT_EQ(parse_shapes("large"), std::nullopt);
}

TEST(BackendCompare, NormwiseError) {
  EXPECT_EQ(normwise_error({1, 2}, {1, 2}), 0);
  EXPECT_DOUBLE_EQ(normwise_error({1, 2.5f}, {1, -2}), 4.5 / 2);
  EXPECT_EQ(normwise_error({NAN}, {1}), INFINITY);
  EXPECT_EQ(normwise_error({1}, {1, 2}), INFINITY);
}

// The values doc/gpu.md quotes.
TEST(BackendCompareTolerance, GammaIsLambdaSqrtNU) {
  using namespace tolerance;
  EXPECT_EQ(gamma(0), 0);
  EXPECT_EQ(gamma(1), 0);
  for (int64_t n : {2, 64, 4096, 11008, 1 << 20})
    EXPECT_NEAR(gamma(n) / (9 * std::sqrt(double(n)) * 0x1p-24), 1, 1e-3) << n;
  EXPECT_NEAR(gamma(4096), 3.4332e-5, 1e-9);  // 9 * 64 * 2^-24, plus second-order terms
  EXPECT_LT(gamma(4096), gamma(4097));
  EXPECT_DOUBLE_EQ(sum_of(4096), 2 * gamma(4096));
  EXPECT_NEAR(sum_of(11008), 1.1257e-4, 1e-8);
  EXPECT_NEAR(sum_of(32000), 1.9193e-4, 1e-8);
}

TEST(BackendCompareTolerance, Bf16IsOneUlpOfTheRoundedValue) {
  using namespace tolerance;
  EXPECT_EQ(bf16_rounded(0), 0x1p-7);
  EXPECT_DOUBLE_EQ(bf16_rounded(1e-5, 3, 2), 1.5 * 0x1p-7 + 1e-5);
  EXPECT_EQ(bf16_rounded(0, 1, 0), 0x1p-7);  // an all-zero output
}

// Below the floors nothing changes for the small shapes; at the layer sizes the
// bounds take over.
TEST(BackendCompareTolerance, SmallShapesKeepTheirFloorsLayerSizesGrow) {
  auto a = make_cpu_backend(DType::kF32), b = make_cpu_backend(DType::kF32);
  const CompareReport report = compare_backends(*a, *b, Shapes::kLayerMini);
  for (const CompareRow& r : report.rows) {
    if (r.kernel == "adamw")
      EXPECT_DOUBLE_EQ(r.tolerance, r.output == "param copy"
                                        ? tolerance::kBf16 + tolerance::kElementwise
                                        : tolerance::kElementwise)
          << r.output;
    if ((r.kernel.rfind("rope", 0) == 0 || r.kernel.rfind("swiglu", 0) == 0) &&
        r.shape.find("act=bf16") == std::string::npos)
      EXPECT_EQ(r.tolerance, tolerance::kElementwise);
    if (r.shape == "M=65 in=130 out=257 w=fp32 beta=0" && r.output == "dx")
      EXPECT_DOUBLE_EQ(r.tolerance, tolerance::sum_of(257));
    if (r.shape == "M=37 in=19 out=23 w=fp32 beta=0")
      EXPECT_EQ(r.tolerance, tolerance::kReduction);
  }
}

}  // namespace
}  // namespace amsp::backend
