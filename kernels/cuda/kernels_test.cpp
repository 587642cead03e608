// The CUDA kernels of kernels/cuda/ops.h (all but attention), run under the
// SIMT emulation, against the CPU reference: kernels/cpu for fp32 and the CPU
// backend (amsp::backend::CpuBackend) for its bf16 semantics. Device memory is
// host memory in the emulation, so std::vector buffers and the null stream do.
//
// Tolerances, per kernel:
//   - bit-identical where the GPU does the CPU's operations in the CPU's order:
//     conversions, add, embedding (both directions: the
//     backward sums each token's rows in row order like the CPU), RMSNorm's dw
//     (each column in chunks of kRmsnormDwRows rows, the chunks in order) and
//     apply, RoPE, SwiGLU,
//     cross-entropy backward (given the same lse), AdamW;
//   - a few ulp where a row sum is a block reduction (a tree, not the CPU's
//     vectorised order): sums are in double and rounded to fp32 once, so
//     inv_rms and lse come out within 1 ulp (2 allowed); y = w * (x * inv)
//     within 4 ulp; dx = inv*w*dy - x*coef cancels, so it is bounded by 8 ulp
//     of the row's largest |dx| term rather than of each element;
//   - sum_squares: double sums in another order, relative 1e-12.
// Every test prints its worst error.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu_backend.h"
#include "kernels/common/math.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/emu/simt.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pack.cuh"
#include "kernels/cuda/reduce.cuh"

namespace amsp::emu::simt {
// The schedule's name in gtest's messages.
inline void PrintTo(Order order, std::ostream* os) {
  *os << (order == Order::kForward ? "forward" : order == Order::kReverse ? "reverse" : "lowest-first");
}
}  // namespace amsp::emu::simt

namespace {

namespace cuda = amsp::kernels::cuda;
namespace cpu = amsp::kernels;
using amsp::DType;
using amsp::backend::CpuBackend;
using amsp::backend::View;
using bf16 = uint16_t;

std::vector<float> random_floats(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

std::vector<bf16> to_bf16_host(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = cpu::float_to_bf16(v[i]);
  return out;
}

View f32_view(std::vector<float>& v) { return View{v.data(), DType::kF32, int64_t(v.size())}; }
View bf16_view(std::vector<bf16>& v) { return View{v.data(), DType::kBF16, int64_t(v.size())}; }
View i32_view(std::vector<int32_t>& v) { return View{v.data(), DType::kI32, int64_t(v.size())}; }

// Distance in representable floats (same sign assumed apart from around 0).
int64_t ulps(float a, float b) {
  auto key = [](float f) {
    int32_t i;
    std::memcpy(&i, &f, sizeof i);
    return i < 0 ? int64_t{std::numeric_limits<int32_t>::min()} - i : int64_t{i};
  };
  return std::llabs(key(a) - key(b));
}

// The worst error of one check, printed when the check ends.
struct Worst {
  std::string what;
  int64_t max_ulps = 0;
  double max_abs = 0.0;
  int64_t mismatches = 0;
  ~Worst() {
    std::printf("  worst %-44s %3lld ulp, abs %.3g, %lld elements differ\n", what.c_str(),
                static_cast<long long>(max_ulps), max_abs, static_cast<long long>(mismatches));
  }
  void add(float got, float want) {
    if (std::memcmp(&got, &want, sizeof got) == 0) return;
    ++mismatches;
    max_ulps = std::max(max_ulps, ulps(got, want));
    max_abs = std::max(max_abs, std::fabs(double(got) - double(want)));
  }
};

void expect_same(const std::string& what, const std::vector<float>& got,
                 const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  Worst w{what};
  for (size_t i = 0; i < got.size(); ++i) w.add(got[i], want[i]);
  EXPECT_EQ(w.mismatches, 0) << what << ": not bit-identical";
}

void expect_same(const std::string& what, const std::vector<bf16>& got,
                 const std::vector<bf16>& want) {
  ASSERT_EQ(got.size(), want.size());
  Worst w{what};
  for (size_t i = 0; i < got.size(); ++i)
    w.add(cpu::bf16_to_float(got[i]), cpu::bf16_to_float(want[i]));
  EXPECT_EQ(w.mismatches, 0) << what << ": not bit-identical";
}

void expect_ulps(const std::string& what, const std::vector<float>& got,
                 const std::vector<float>& want, int64_t bound) {
  ASSERT_EQ(got.size(), want.size());
  Worst w{what};
  for (size_t i = 0; i < got.size(); ++i) w.add(got[i], want[i]);
  EXPECT_LE(w.max_ulps, bound) << what;
}

// |got - want| <= bound ulps of `scale[row]` (the row's largest magnitude).
void expect_row_ulps(const std::string& what, const std::vector<float>& got,
                     const std::vector<float>& want, int64_t dim, const std::vector<float>& scale,
                     double bound) {
  ASSERT_EQ(got.size(), want.size());
  Worst w{what};
  double worst_rel = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    w.add(got[i], want[i]);
    const float s = scale[i / static_cast<size_t>(dim)];
    const double ulp = std::nextafter(s, INFINITY) - s;
    worst_rel = std::max(worst_rel, std::fabs(double(got[i]) - double(want[i])) / ulp);
  }
  std::printf("  %s: worst error %.2f ulp of the row's largest term\n", what.c_str(), worst_rel);
  EXPECT_LE(worst_rel, bound) << what;
}

std::string shape(const char* name, std::initializer_list<int64_t> dims) {
  std::string s = std::string(name) + " [";
  for (int64_t d : dims) s += std::to_string(d) + ",";
  s.back() = ']';
  return s;
}

// Every test runs under each of the SIMT emulation's schedules: a missing
// barrier reads shared memory too early in one of them.
using amsp::emu::simt::Order;
class CudaKernels : public ::testing::TestWithParam<Order> {
 protected:
  void SetUp() override { amsp::emu::simt::set_order(GetParam()); }
  void TearDown() override { amsp::emu::simt::set_order(Order::kForward); }
};
INSTANTIATE_TEST_SUITE_P(Order, CudaKernels,
                         ::testing::Values(Order::kForward, Order::kReverse, Order::kLowestFirst),
                         [](const ::testing::TestParamInfo<Order>& info) {
                           return info.param == Order::kForward   ? "forward"
                                  : info.param == Order::kReverse ? "reverse"
                                                                  : "lowest_first";
                         });

// ---- the reductions of reduce.cuh -------------------------------------------------------

// Two block reductions back to back share their shared slots: the second may
// only write them once every warp has read the first's.
__global__ void back_to_back_kernel(const float* x, float* out, int n) {
  const int i = static_cast<int>(threadIdx.x);
  const float a = cuda::block_sum(i < n ? x[i] : 0.0f);
  const float b = cuda::block_sum(i < n ? 2.0f * x[i] : 0.0f);
  out[i] = a;
  out[blockDim.x + threadIdx.x] = b;
}

TEST_P(CudaKernels, BlockReductionsBackToBack) {
  for (int threads : {32, 64, 256, 1024}) {
    const int n = threads - 5;
    std::vector<float> x(threads), out(2 * threads);
    for (int i = 0; i < threads; ++i) x[i] = static_cast<float>(i % 5);  // exact sums
    AMSP_LAUNCH(back_to_back_kernel, 1, threads, 0, nullptr)(x.data(), out.data(), n);
    float want = 0.0f;
    for (int i = 0; i < n; ++i) want += x[i];
    for (int i = 0; i < threads; ++i) {
      ASSERT_EQ(out[i], want) << threads << " threads, thread " << i;
      ASSERT_EQ(out[threads + i], 2.0f * want) << threads << " threads, thread " << i;
    }
  }
}

// ---- batched loads (pack.cuh) ------------------------------------------------------------

// Every index of first, first + stride, ... below end, each once and in
// order; each batch's loads all before its uses; a last batch cut short by end.
TEST(Batched, LoadsEachBatchBeforeUsingItAndVisitsEveryIndexOnceInOrder) {
  struct Case {
    int64_t first, end, stride;
  };
  for (const Case& c :
       {Case{0, 0, 1}, Case{3, 4, 5}, Case{0, 10, 1}, Case{2, 40, 3}, Case{7, 1000, 64}}) {
    std::vector<std::string> events;
    std::vector<int64_t> used;
    cuda::batched<3>(
        c.first, c.end, c.stride,
        [&](int64_t i) {
          events.push_back("load " + std::to_string(i));
          return i * 10;
        },
        [&](int64_t i, int64_t loaded) {
          EXPECT_EQ(loaded, i * 10);
          events.push_back("use " + std::to_string(i));
          used.push_back(i);
        });
    std::vector<std::string> want;
    std::vector<int64_t> indices;
    for (int64_t i = c.first; i < c.end; i += c.stride) indices.push_back(i);
    for (size_t b = 0; b < indices.size(); b += 3) {
      const size_t e = std::min(indices.size(), b + 3);
      for (size_t k = b; k < e; ++k) want.push_back("load " + std::to_string(indices[k]));
      for (size_t k = b; k < e; ++k) want.push_back("use " + std::to_string(indices[k]));
    }
    EXPECT_EQ(used, indices) << c.first << ".." << c.end << " by " << c.stride;
    EXPECT_EQ(events, want) << c.first << ".." << c.end << " by " << c.stride;
  }
}

// A held row: every load first, then each pass visits the indices below end
// in order, as often as asked, with what was loaded; none past end.
TEST(Held, LoadsEveryIndexOnceThenVisitsThemInOrderEachPass) {
  struct Case {
    int64_t first, end, stride;
  };
  for (const Case& c :
       {Case{0, 0, 1}, Case{3, 4, 5}, Case{0, 3, 1}, Case{2, 8, 3}, Case{7, 9, 64}}) {
    std::vector<int64_t> loads, indices, visits;
    const auto row = cuda::hold<3>(c.first, c.end, c.stride, [&](int64_t i) {
      loads.push_back(i);
      return i * 10;
    });
    for (int64_t i = c.first; i < c.end; i += c.stride) indices.push_back(i);
    EXPECT_EQ(loads, indices) << c.first << ".." << c.end << " by " << c.stride;
    for (int pass = 0; pass < 2; ++pass) {
      visits.clear();
      row.visit([&](int64_t i, int64_t loaded) {
        EXPECT_EQ(loaded, i * 10);
        visits.push_back(i);
      });
      EXPECT_EQ(visits, indices) << "pass " << pass << ", " << c.first << ".." << c.end;
    }
  }
}

// ---- conversions, add, sum of squares ----------------------------------------

const int64_t kSizes[] = {0, 1, 31, 255, 256, 257, 1000, 2 * cuda::kSumSquaresChunk + 17};

TEST_P(CudaKernels, ConversionsAndRounding) {
  CpuBackend ref(DType::kF32);
  for (int64_t n : kSizes) {
    std::vector<float> x = random_floats(n, 1, 3.0f), back(n), want_back(n), rounded(n);
    std::vector<bf16> y(n), want(n);
    cuda::to_bf16(x.data(), y.data(), n, nullptr);
    ref.copy(f32_view(x), bf16_view(want));
    expect_same(shape("to_bf16", {n}), y, want);
    cuda::to_f32(y.data(), back.data(), n, nullptr);
    ref.copy(bf16_view(want), f32_view(want_back));
    expect_same(shape("to_f32", {n}), back, want_back);
    cuda::round_bf16_values(x.data(), rounded.data(), n, nullptr);
    expect_same(shape("round_bf16_values", {n}), rounded, want_back);
    cuda::round_bf16_values(x.data(), x.data(), n, nullptr);  // in place
    expect_same(shape("round_bf16_values in place", {n}), x, want_back);
  }
}

TEST_P(CudaKernels, AddAllDtypes) {
  CpuBackend ref(DType::kF32);
  for (int64_t n : kSizes) {
    const std::vector<float> a = random_floats(n, 2), b = random_floats(n, 3);
    std::vector<float> d = a, dw = a, s = b;
    std::vector<bf16> sb = to_bf16_host(b), db = to_bf16_host(a), dbw = db;
    cuda::add(d.data(), s.data(), n, nullptr);
    ref.add(f32_view(dw), f32_view(s));
    expect_same(shape("add f32 += f32", {n}), d, dw);
    d = a, dw = a;
    cuda::add(d.data(), sb.data(), n, nullptr);
    ref.add(f32_view(dw), bf16_view(sb));
    expect_same(shape("add f32 += bf16", {n}), d, dw);
    cuda::add(db.data(), s.data(), n, nullptr);
    ref.add(bf16_view(dbw), f32_view(s));
    expect_same(shape("add bf16 += f32", {n}), db, dbw);
    cuda::add(db.data(), sb.data(), n, nullptr);
    ref.add(bf16_view(dbw), bf16_view(sb));
    expect_same(shape("add bf16 += bf16", {n}), db, dbw);
  }
}

// Arrays that start one element past a pack go one element at a time: the
// same bits as the aligned arrays, which go by packs.
TEST_P(CudaKernels, UnalignedConversionsAndAdds) {
  const int64_t n = 1001;
  const std::vector<float> x = random_floats(n, 4, 3.0f), a = random_floats(n, 5);
  std::vector<bf16> y(n), want(n);
  cuda::to_bf16(x.data() + 1, y.data() + 1, n - 1, nullptr);
  cuda::to_bf16(x.data(), want.data(), n, nullptr);
  y[0] = want[0];
  expect_same("to_bf16 unaligned", y, want);
  std::vector<float> back(n), want_back(n);
  cuda::to_f32(want.data() + 1, back.data() + 1, n - 1, nullptr);
  cuda::to_f32(want.data(), want_back.data(), n, nullptr);
  back[0] = want_back[0];
  expect_same("to_f32 unaligned", back, want_back);
  std::vector<float> d = a, want_d = a;
  cuda::add(d.data() + 1, x.data() + 1, n - 1, nullptr);
  cuda::add(want_d.data(), x.data(), n, nullptr);
  d[0] = want_d[0];
  expect_same("add f32 += f32 unaligned", d, want_d);
  std::vector<bf16> db = to_bf16_host(a), want_db = db;
  cuda::add(db.data() + 1, want.data() + 1, n - 1, nullptr);
  cuda::add(want_db.data(), want.data(), n, nullptr);
  db[0] = want_db[0];
  expect_same("add bf16 += bf16 unaligned", db, want_db);
}

TEST_P(CudaKernels, SumSquares) {
  CpuBackend ref(DType::kF32);
  double worst = 0.0;
  for (int64_t n : kSizes) {
    std::vector<float> x = random_floats(n, 6, 2.0f);
    std::vector<bf16> xb = to_bf16_host(x);
    std::vector<double> partials(cuda::sum_squares_chunks(n) + 1, -1.0);
    double out = -1.0;
    cuda::sum_squares(x.data(), n, partials.data(), &out, nullptr);
    const double want = ref.sum_squares(f32_view(x));
    EXPECT_NEAR(out, want, 1e-12 * want) << "fp32, n = " << n;
    worst = std::max(worst, want > 0 ? std::fabs(out - want) / want : std::fabs(out));
    cuda::sum_squares(xb.data(), n, partials.data(), &out, nullptr);
    const double want_b = ref.sum_squares(bf16_view(xb));
    EXPECT_NEAR(out, want_b, 1e-12 * want_b) << "bf16, n = " << n;
    worst = std::max(worst, want_b > 0 ? std::fabs(out - want_b) / want_b : std::fabs(out));
    // One element past a pack: every element one at a time.
    if (n < 2) continue;
    cuda::sum_squares(x.data() + 1, n - 1, partials.data(), &out, nullptr);
    const double want_1 = want - static_cast<double>(x[0]) * x[0];
    EXPECT_NEAR(out, want_1, 1e-12 * want) << "fp32 unaligned, n = " << n - 1;
  }
  std::printf("  worst sum_squares relative error %.3g\n", worst);
}

// More chunks than the summing block has threads (300 against 256): some threads add
// two chunks' partial sums, in order.
TEST_P(CudaKernels, SumSquaresOfMoreChunksThanThreads) {
  CpuBackend ref(DType::kF32);
  const int64_t n = 300 * cuda::kSumSquaresChunk + 7;
  std::vector<float> x = random_floats(n, 8, 2.0f);
  std::vector<double> partials(cuda::sum_squares_chunks(n), -1.0);
  double out = -1.0;
  cuda::sum_squares(x.data(), n, partials.data(), &out, nullptr);
  const double want = ref.sum_squares(f32_view(x));
  EXPECT_NEAR(out, want, 1e-12 * want) << "n = " << n;
}

// ---- embedding ------------------------------------------------------------------------

struct EmbeddingShape {
  int64_t rows, dim, vocab;
};
const EmbeddingShape kEmbeddingShapes[] = {
    {1, 1, 1}, {0, 8, 5}, {7, 3, 5}, {300, 33, 50257}, {1000, 5, 3}, {64, 257, 70},
    {2500, 3, 37}};  // more rows than the sort's tile of 1024

std::vector<int32_t> random_tokens(int64_t rows, int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  // Few distinct tokens in a small range, so tokens repeat.
  std::uniform_int_distribution<int64_t> dist(0, std::min<int64_t>(vocab - 1, 40));
  std::vector<int32_t> t(static_cast<size_t>(rows));
  for (int32_t& x : t) x = static_cast<int32_t>(dist(gen) * (vocab - 1) / std::max<int64_t>(1, std::min<int64_t>(vocab - 1, 40)));
  return t;
}

TEST_P(CudaKernels, EmbeddingForward) {
  CpuBackend ref(DType::kF32);
  for (const EmbeddingShape& s : kEmbeddingShapes) {
    std::vector<int32_t> tokens = random_tokens(s.rows, s.vocab, 7);
    std::vector<float> table = random_floats(s.vocab * s.dim, 8);
    std::vector<bf16> table_b = to_bf16_host(table);
    std::vector<float> out(s.rows * s.dim, -1.0f), want(out.size());
    const std::string sh = shape("embedding_forward", {s.rows, s.dim, s.vocab});
    cuda::embedding_forward(tokens.data(), table.data(), out.data(), s.rows, s.dim, nullptr);
    ref.embedding_forward(i32_view(tokens), f32_view(table), f32_view(want), s.rows, s.dim);
    expect_same(sh + " f32", out, want);
    cuda::embedding_forward(tokens.data(), table_b.data(), out.data(), s.rows, s.dim, nullptr);
    ref.embedding_forward(i32_view(tokens), bf16_view(table_b), f32_view(want), s.rows, s.dim);
    expect_same(sh + " bf16", out, want);
  }
}

TEST_P(CudaKernels, EmbeddingBackward) {
  CpuBackend ref(DType::kF32);
  for (const EmbeddingShape& s : kEmbeddingShapes) {
    std::vector<int32_t> tokens = random_tokens(s.rows, s.vocab, 9);
    std::vector<float> dout = random_floats(s.rows * s.dim, 10);
    std::vector<float> dtable = random_floats(s.vocab * s.dim, 11), want = dtable;
    std::vector<bf16> dtable_b = to_bf16_host(dtable), want_b = dtable_b;
    std::vector<int32_t> work(cuda::embedding_backward_workspace(s.rows, s.vocab), -7);
    const std::string sh = shape("embedding_backward", {s.rows, s.dim, s.vocab});
    cuda::embedding_backward(tokens.data(), dout.data(), dtable.data(), s.rows, s.dim, s.vocab,
                             work.data(), nullptr);
    ref.embedding_backward(i32_view(tokens), f32_view(dout), f32_view(want), s.rows, s.dim);
    expect_same(sh + " f32", dtable, want);
    cuda::embedding_backward(tokens.data(), dout.data(), dtable_b.data(), s.rows, s.dim, s.vocab,
                             work.data(), nullptr);
    ref.embedding_backward(i32_view(tokens), f32_view(dout), bf16_view(want_b), s.rows, s.dim);
    expect_same(sh + " bf16", dtable_b, want_b);
  }
}

// ---- RMSNorm --------------------------------------------------------------------------

struct RowsDim {
  int64_t rows, dim;
};
// By packs where dim is a multiple of 4: 2060 and 4096 give some threads a
// second batch of packs (pack.cuh, batched), 2060's cut short; 1500 and 2048
// a row held in registers of two packs a thread (norm.cu, two_passes), 1500's
// second pack only for some threads.
const RowsDim kNormShapes[] = {{1, 1},    {0, 16},   {3, 7},    {5, 256},  {2, 1000}, {300, 65},
                               {4, 4097}, {70, 300}, {3, 1500}, {2, 2048}, {2, 2060}, {3, 4096}};

template <typename W>
std::vector<W> weights(const std::vector<float>& w);
template <>
std::vector<float> weights(const std::vector<float>& w) {
  return w;
}
template <>
std::vector<bf16> weights(const std::vector<float>& w) {
  return to_bf16_host(w);
}
View view_of(std::vector<float>& v) { return f32_view(v); }
float widen(float x) { return x; }
float widen(bf16 x) { return cpu::bf16_to_float(x); }
View view_of(std::vector<bf16>& v) { return bf16_view(v); }

template <typename W>
void check_rmsnorm_forward(const char* dtype) {
  CpuBackend ref(DType::kF32);
  for (const RowsDim& s : kNormShapes) {
    std::vector<float> x = random_floats(s.rows * s.dim, 12, 2.0f), wf = random_floats(s.dim, 13);
    std::vector<W> w = weights<W>(wf);
    std::vector<float> y(x.size()), inv(s.rows), want_y(x.size()), want_inv(s.rows);
    const std::string sh = shape("rmsnorm", {s.rows, s.dim}) + " w " + dtype;
    cuda::rmsnorm_forward(x.data(), w.data(), y.data(), inv.data(), s.rows, s.dim, 1e-5f, nullptr);
    ref.rmsnorm_forward(f32_view(x), view_of(w), f32_view(want_y), f32_view(want_inv), s.rows,
                        s.dim, 1e-5f);
    expect_ulps(sh + " forward inv_rms", inv, want_inv, 2);
    expect_ulps(sh + " forward y", y, want_y, 4);
    // apply from the CPU's inv_rms: the CPU's operations exactly.
    std::vector<float> y2(x.size(), -1.0f);
    cuda::rmsnorm_apply(x.data(), w.data(), want_inv.data(), y2.data(), s.rows, s.dim, nullptr);
    expect_same(sh + " apply", y2, want_y);
    // A bf16 y: the CPU backend's bits (the fp32 y rounded once).
    std::vector<bf16> y16(x.size()), want_y16(x.size());
    cuda::rmsnorm_apply(x.data(), w.data(), want_inv.data(), y16.data(), s.rows, s.dim, nullptr);
    ref.rmsnorm_apply(f32_view(x), view_of(w), f32_view(want_inv), bf16_view(want_y16), s.rows, s.dim);
    expect_same(sh + " apply, y bf16", y16, want_y16);
  }
}

TEST_P(CudaKernels, RmsnormForwardF32) { check_rmsnorm_forward<float>("f32"); }
TEST_P(CudaKernels, RmsnormForwardBf16) { check_rmsnorm_forward<bf16>("bf16"); }

template <typename W, typename DW>
void check_rmsnorm_backward(const char* dtypes) {
  CpuBackend ref(DType::kF32);
  for (const RowsDim& s : kNormShapes) {
    const int64_t n = s.rows * s.dim;
    std::vector<float> x = random_floats(n, 14, 2.0f), dy = random_floats(n, 15);
    std::vector<W> w = weights<W>(random_floats(s.dim, 16));
    std::vector<float> inv(s.rows), y(n);
    ref.rmsnorm_forward(f32_view(x), view_of(w), f32_view(y), f32_view(inv), s.rows, s.dim, 1e-5f);
    std::vector<float> dx = random_floats(n, 17), want_dx = dx;  // dx accumulates
    std::vector<DW> dw = weights<DW>(random_floats(s.dim, 18)), want_dw = dw;
    std::vector<double> work(static_cast<size_t>(cuda::rmsnorm_backward_workspace(s.rows, s.dim)) + 1, -7.0);
    cuda::rmsnorm_backward(dy.data(), x.data(), w.data(), inv.data(), dx.data(), nullptr, dw.data(),
                           true, s.rows, s.dim, work.data(), nullptr);
    ref.rmsnorm_backward(f32_view(dy), f32_view(x), view_of(w), f32_view(inv), f32_view(want_dx),
                         view_of(want_dw), s.rows, s.dim, {}, 1.0f);
    const std::string sh = shape("rmsnorm_backward", {s.rows, s.dim}) + " " + dtypes;
    // The scale of dx's terms in each row: the old dx plus inv*|w dy| + |x coef|,
    // bounded by the largest |dx| and |inv * w * dy| of the row.
    std::vector<float> scale(s.rows, 0.0f);
    for (int64_t i = 0; i < n; ++i) {
      const float wi = widen(w[i % s.dim]);
      const float t = std::max(std::fabs(want_dx[i]), std::fabs(inv[i / s.dim] * wi * dy[i]));
      scale[i / s.dim] = std::max(scale[i / s.dim], t);
    }
    expect_row_ulps(sh + " dx", dx, want_dx, std::max<int64_t>(s.dim, 1), scale, 8.0);
    expect_same(sh + " dw", dw, want_dw);
    // A bf16 dy, widened on both sides: the same order and bits for dw, here
    // written (what dw held before is not read). And the updated dx rounded
    // to bf16 in the same pass, as a bf16 model asks: each side's own dx
    // rounded once.
    std::vector<bf16> dy16 = to_bf16_host(dy), rounded(static_cast<size_t>(n)),
                      want_rounded = rounded;
    std::vector<float> dx16 = random_floats(n, 17), want_dx16 = dx16;
    std::vector<DW> dw16 = weights<DW>(random_floats(s.dim, 18)), want_dw16 = dw16;
    cuda::rmsnorm_backward(dy16.data(), x.data(), w.data(), inv.data(), dx16.data(), rounded.data(),
                           dw16.data(), false, s.rows, s.dim, work.data(), nullptr);
    ref.rmsnorm_backward(bf16_view(dy16), f32_view(x), view_of(w), f32_view(inv),
                         f32_view(want_dx16), view_of(want_dw16), s.rows, s.dim,
                         bf16_view(want_rounded), 0.0f);
    expect_row_ulps(sh + " dx, dy bf16", dx16, want_dx16, std::max<int64_t>(s.dim, 1), scale, 8.0);
    expect_same(sh + " dw, dy bf16", dw16, want_dw16);
    expect_same(sh + " dx rounded", rounded, to_bf16_host(dx16));
    expect_same(sh + " dx rounded (CPU)", want_rounded, to_bf16_host(want_dx16));
  }
}

TEST_P(CudaKernels, RmsnormBackwardF32F32) { check_rmsnorm_backward<float, float>("w f32 dw f32"); }
TEST_P(CudaKernels, RmsnormBackwardF32Bf16) { check_rmsnorm_backward<float, bf16>("w f32 dw bf16"); }
TEST_P(CudaKernels, RmsnormBackwardBf16F32) { check_rmsnorm_backward<bf16, float>("w bf16 dw f32"); }
TEST_P(CudaKernels, RmsnormBackwardBf16Bf16) {
  check_rmsnorm_backward<bf16, bf16>("w bf16 dw bf16");
}

// ---- RoPE -----------------------------------------------------------------------------

TEST_P(CudaKernels, Rope) {
  struct Shape {
    int64_t B, T, heads, head_dim, row_stride;
  };
  // row_stride > heads * head_dim: the columns past the heads must stay. Packs
  // of four pairs where half the head dim and the stride are multiples of 4
  // (the last two: 40 and 576 items a row, a block of 256 threads taking a
  // row or half of one, some threads two items), one pair at a time elsewhere.
  for (const Shape& s :
       {Shape{1, 1, 1, 2, 2}, Shape{2, 5, 3, 8, 30}, Shape{3, 7, 4, 6, 24}, Shape{0, 4, 2, 4, 8},
        Shape{1, 300, 5, 66, 333}, Shape{2, 9, 5, 64, 324}, Shape{1, 3, 72, 64, 4612}}) {
    const int64_t T = std::max<int64_t>(s.T, 1);
    std::vector<float> cos(T * s.head_dim / 2), sin(cos.size());
    cpu::rope_table(cos.data(), sin.data(), T, s.head_dim, 10000.0);
    const std::vector<float> x0 = random_floats(s.B * s.T * s.row_stride, 19);
    std::vector<float> x = x0, want = x0;
    const std::string sh = shape("rope", {s.B, s.T, s.heads, s.head_dim, s.row_stride});
    cuda::rope_forward(x.data(), cos.data(), sin.data(), s.B, s.T, s.heads, s.head_dim,
                       s.row_stride, nullptr);
    cpu::rope_forward(want.data(), cos.data(), sin.data(), s.B, s.T, s.heads, s.head_dim,
                      s.row_stride);
    expect_same(sh + " forward", x, want);
    cuda::rope_backward(x.data(), cos.data(), sin.data(), s.B, s.T, s.heads, s.head_dim,
                        s.row_stride, nullptr);
    cpu::rope_backward(want.data(), cos.data(), sin.data(), s.B, s.T, s.heads, s.head_dim,
                       s.row_stride);
    expect_same(sh + " backward", x, want);
    // bf16 values: the same bits as the CPU kernel's bf16 overload.
    std::vector<bf16> x16 = to_bf16_host(x0), want16 = x16;
    cuda::rope_forward(x16.data(), cos.data(), sin.data(), s.B, s.T, s.heads, s.head_dim, s.row_stride,
                       nullptr);
    cpu::rope_forward(want16.data(), cos.data(), sin.data(), s.B, s.T, s.heads, s.head_dim, s.row_stride);
    expect_same(sh + " forward bf16", x16, want16);
    cuda::rope_backward(x16.data(), cos.data(), sin.data(), s.B, s.T, s.heads, s.head_dim, s.row_stride,
                        nullptr);
    cpu::rope_backward(want16.data(), cos.data(), sin.data(), s.B, s.T, s.heads, s.head_dim, s.row_stride);
    expect_same(sh + " backward bf16", x16, want16);
  }
}

// ---- SwiGLU ---------------------------------------------------------------------------

TEST_P(CudaKernels, Swiglu) {
  // One row of n (gate, up and dgate, dup in buffers of their own), then the
  // model's layout: gate and up side by side in rows of 2 cols.
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{65537}}) {
    const std::vector<float> gate = random_floats(n, 20, 4.0f), up = random_floats(n, 21),
                             dout = random_floats(n, 22);
    std::vector<float> out(n), want(n), dg(n), du(n), want_dg(n), want_du(n);
    cuda::swiglu_forward(gate.data(), up.data(), n, out.data(), 1, n, nullptr);
    cpu::swiglu_forward(gate.data(), up.data(), n, want.data(), 1, n);
    expect_same(shape("swiglu_forward", {n}), out, want);
    cuda::swiglu_backward(gate.data(), up.data(), n, dout.data(), dg.data(), du.data(), 1, n,
                          nullptr);
    cpu::swiglu_backward(gate.data(), up.data(), n, dout.data(), want_dg.data(), want_du.data(), 1,
                         n);
    expect_same(shape("swiglu_backward dgate", {n}), dg, want_dg);
    expect_same(shape("swiglu_backward dup", {n}), du, want_du);
    // dup may be dout when the rows are packed: dgate must come from dout as it
    // was, not from the dup already written over it.
    std::vector<float> alias = dout;
    dg.assign(dg.size(), 0.0f);
    cuda::swiglu_backward(gate.data(), up.data(), n, alias.data(), dg.data(), alias.data(), 1, n,
                          nullptr);
    expect_same(shape("swiglu_backward dup aliasing dout", {n}), alias, want_du);
    expect_same(shape("swiglu_backward dgate, dup aliasing dout", {n}), dg, want_dg);
  }
  // Both of the kernels' paths: packs of 16 bytes (every row aligned, lengths
  // multiples of 8) and one element at a time (a length that is not, or every
  // buffer one element off alignment: `off`).
  for (auto [rows, cols, off] :
       {std::array<int64_t, 3>{3, 7, 0}, {37, 1000, 0}, {5, 4096, 0}, {37, 1000, 1}}) {
    const int64_t n = rows * cols;
    const std::vector<float> gate_up = random_floats(2 * n + off, 23, 4.0f),
                             dout = random_floats(n + off, 24);
    std::vector<float> out(n + off), want(n + off), d(2 * n + off), want_d(2 * n + off);
    const float* g = gate_up.data() + off;
    const std::string sh = shape("swiglu", {rows, cols, off});
    cuda::swiglu_forward(g, g + cols, 2 * cols, out.data() + off, rows, cols, nullptr);
    cpu::swiglu_forward(g, g + cols, 2 * cols, want.data() + off, rows, cols);
    expect_same(sh + " forward gate|up", out, want);
    cuda::swiglu_backward(g, g + cols, 2 * cols, dout.data() + off, d.data() + off,
                          d.data() + off + cols, rows, cols, nullptr);
    cpu::swiglu_backward(g, g + cols, 2 * cols, dout.data() + off, want_d.data() + off,
                         want_d.data() + off + cols, rows, cols);
    expect_same(sh + " backward dgate|dup", d, want_d);
    // bf16 activations: the same bits as the CPU kernel's bf16 overload.
    const std::vector<bf16> gu16 = to_bf16_host(gate_up), dout16 = to_bf16_host(dout);
    std::vector<bf16> out16(n + off), want16(n + off), d16(2 * n + off), want_d16(2 * n + off);
    const bf16* g16 = gu16.data() + off;
    cuda::swiglu_forward(g16, g16 + cols, 2 * cols, out16.data() + off, rows, cols, nullptr);
    cpu::swiglu_forward(g16, g16 + cols, 2 * cols, want16.data() + off, rows, cols);
    expect_same(sh + " forward bf16 gate|up", out16, want16);
    cuda::swiglu_backward(g16, g16 + cols, 2 * cols, dout16.data() + off, d16.data() + off,
                          d16.data() + off + cols, rows, cols, nullptr);
    cpu::swiglu_backward(g16, g16 + cols, 2 * cols, dout16.data() + off, want_d16.data() + off,
                         want_d16.data() + off + cols, rows, cols);
    expect_same(sh + " backward bf16 dgate|dup", d16, want_d16);
  }
}

// ---- cross-entropy --------------------------------------------------------------------

// By packs where the vocabulary is a multiple of 8 (bf16) or 4 (fp32): 1000
// and LLaMA's 32000 (16 packs a thread in batches of 4), else one at a time.
const RowsDim kLossShapes[] = {{1, 1},   {0, 5},    {3, 50257}, {70, 33},
                               {5, 257}, {1, 1000}, {3, 32000}};

std::vector<int32_t> loss_targets(int64_t rows, int64_t V, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int64_t> dist(0, V - 1);
  std::vector<int32_t> t(static_cast<size_t>(rows));
  for (size_t r = 0; r < t.size(); ++r) t[r] = r % 4 == 2 ? -1 : static_cast<int32_t>(dist(gen));
  return t;
}

TEST_P(CudaKernels, CrossEntropyForward) {
  for (const RowsDim& s : kLossShapes) {
    const std::vector<float> logits = random_floats(s.rows * s.dim, 23, 3.0f);
    const std::vector<int32_t> targets = loss_targets(s.rows, s.dim, 24);
    std::vector<float> lse(s.rows), losses(s.rows, -1.0f), want_lse(s.rows);
    int32_t bad = INT32_MAX;
    cuda::cross_entropy_forward(logits.data(), targets.data(), lse.data(), losses.data(), &bad,
                                s.rows, s.dim, nullptr);
    int64_t count = 0;
    const double want = cpu::cross_entropy_forward(logits.data(), targets.data(),
                                                   want_lse.data(), s.rows, s.dim, &count);
    const std::string sh = shape("cross_entropy_forward", {s.rows, s.dim});
    expect_ulps(sh + " lse", lse, want_lse, 2);
    double total = 0.0;
    for (int64_t r = 0; r < s.rows; ++r) {
      total += losses[r];
      if (targets[r] < 0) {
        EXPECT_EQ(losses[r], 0.0f);
      }
    }
    EXPECT_NEAR(total, want, 1e-6 * std::max(1.0, std::fabs(want))) << sh;
    std::printf("  %s: loss sum %.9g, CPU %.9g\n", sh.c_str(), total, want);
    EXPECT_EQ(bad, INT32_MAX) << sh;
  }
}

TEST_P(CudaKernels, CrossEntropyBadTargetIsReportedNotRead) {
  const int64_t rows = 6, V = 7;
  const std::vector<float> logits = random_floats(rows * V, 25);
  // Rows 1 and 4 are bad; a read of logits[row, INT32_MAX - 1] would fault.
  const std::vector<int32_t> targets = {0, INT32_MAX - 1, 6, -1, 7, 3};
  std::vector<float> lse(rows), losses(rows, -1.0f);
  int32_t bad = INT32_MAX;
  cuda::cross_entropy_forward(logits.data(), targets.data(), lse.data(), losses.data(), &bad, rows,
                              V, nullptr);
  EXPECT_EQ(bad, 1);
  EXPECT_EQ(losses[1], 0.0f);
  EXPECT_EQ(losses[4], 0.0f);
  EXPECT_GT(losses[0], 0.0f);
}

TEST_P(CudaKernels, CrossEntropyBackward) {
  for (const RowsDim& s : kLossShapes) {
    const std::vector<float> logits = random_floats(s.rows * s.dim, 26, 3.0f);
    const std::vector<int32_t> targets = loss_targets(s.rows, s.dim, 27);
    std::vector<float> lse(s.rows);
    int64_t count = 0;
    cpu::cross_entropy_forward(logits.data(), targets.data(), lse.data(), s.rows, s.dim, &count);
    std::vector<float> g = logits, want = logits;
    cuda::cross_entropy_backward(g.data(), targets.data(), lse.data(), s.rows, s.dim, 0.25f,
                                 nullptr);
    cpu::cross_entropy_backward(want.data(), targets.data(), lse.data(), s.rows, s.dim, 0.25f);
    expect_same(shape("cross_entropy_backward", {s.rows, s.dim}), g, want);
    // bf16 logits: the forward's lse as the CPU's, the gradient the same bits.
    std::vector<bf16> g16 = to_bf16_host(logits), want16 = g16;
    std::vector<float> lse16(s.rows), want_lse16(s.rows), losses16(s.rows);
    int32_t bad = INT32_MAX;
    cuda::cross_entropy_forward(g16.data(), targets.data(), lse16.data(), losses16.data(), &bad, s.rows, s.dim,
                                nullptr);
    cpu::cross_entropy_forward(want16.data(), targets.data(), want_lse16.data(), s.rows, s.dim, &count);
    expect_ulps(shape("cross_entropy_forward bf16", {s.rows, s.dim}) + " lse", lse16, want_lse16, 2);
    cuda::cross_entropy_backward(g16.data(), targets.data(), want_lse16.data(), s.rows, s.dim, 0.25f, nullptr);
    cpu::cross_entropy_backward(want16.data(), targets.data(), want_lse16.data(), s.rows, s.dim, 0.25f);
    expect_same(shape("cross_entropy_backward bf16", {s.rows, s.dim}), g16, want16);
  }
}

// ---- AdamW ----------------------------------------------------------------------------

TEST_P(CudaKernels, AdamWMultiTensor) {
  // 21 tensors: two launches, one of 16 and one of 5, with every grad and copy
  // dtype and empty tensors among them.
  const int64_t sizes[] = {1, 257, 0, 5000, 31, 1000, 3, 70000, 2, 256, 255,
                           0, 9,   4096, 1,  12, 600, 77, 1,    8, 4097};
  const int count = static_cast<int>(std::size(sizes));
  for (float grad_scale : {1.0f, 0.5f}) {
    amsp::backend::AdamWStep step;
    step.lr = 3e-3f, step.beta1 = 0.9f, step.beta2 = 0.95f, step.eps = 1e-8f;
    step.weight_decay = 0.1f, step.bias_correction1 = 1 - 0.9f * 0.9f * 0.9f;
    step.bias_correction2 = 1 - 0.95f * 0.95f * 0.95f, step.grad_scale = grad_scale;
    const cuda::AdamWHyper hyper{step.lr, step.beta1, step.beta2, step.eps, step.bias_correction1,
                                 step.bias_correction2, step.grad_scale, nullptr};
    struct Host {
      std::vector<float> master, m, v, grad, copy_f32;
      std::vector<bf16> grad_b, copy_b;
      std::vector<float> master_out, m_out, v_out;  // every fifth tensor: out of place
    };
    std::vector<Host> gpu(count), want(count);
    std::vector<cuda::AdamWTensor> tensors(count);
    CpuBackend ref(DType::kF32);
    for (int k = 0; k < count; ++k) {
      const int64_t n = sizes[k];
      Host h{random_floats(n, 30 + k), random_floats(n, 60 + k, 0.1f),
             random_floats(n, 90 + k, 0.01f), random_floats(n, 120 + k), {}, {}, {}, {}, {}, {}};
      const bool out_of_place = k % 5 == 4;
      for (float& x : h.v) x = x * x;
      const bool grad_bf16 = k % 2 == 1, copy_bf16 = k % 3 == 1, copy = k % 3 != 0;
      h.grad_b = to_bf16_host(h.grad);
      h.copy_f32.assign(copy && !copy_bf16 ? n : 0, -1.0f);
      h.copy_b.assign(copy && copy_bf16 ? n : 0, 0);
      gpu[k] = want[k] = h;
      Host& g = gpu[k];
      if (out_of_place)
        for (auto* x : {&g.master_out, &g.m_out, &g.v_out}) x->assign(static_cast<size_t>(n), NAN);
      float* out[3] = {g.master.data(), g.m.data(), g.v.data()};
      if (out_of_place) out[0] = g.master_out.data(), out[1] = g.m_out.data(), out[2] = g.v_out.data();
      tensors[k] = cuda::AdamWTensor{
          g.master.data(), g.m.data(), g.v.data(), out[0], out[1], out[2],
          grad_bf16 ? static_cast<const void*>(g.grad_b.data()) : g.grad.data(),
          !copy ? nullptr : copy_bf16 ? static_cast<void*>(g.copy_b.data()) : g.copy_f32.data(),
          n, grad_bf16, copy_bf16, k % 4 == 2 ? 0.0f : 0.1f};  // each tensor its own decay
      Host& w = want[k];
      const View copy_view = !copy ? View{} : copy_bf16 ? bf16_view(w.copy_b) : f32_view(w.copy_f32);
      amsp::backend::AdamWStep own = step;
      own.weight_decay = tensors[k].weight_decay;
      ref.adamw(f32_view(w.master), f32_view(w.m), f32_view(w.v),
                grad_bf16 ? bf16_view(w.grad_b) : f32_view(w.grad), copy_view, own);
    }
    cuda::adamw(tensors.data(), count, hyper, nullptr);
    for (int k = 0; k < count; ++k) {
      const std::string sh = shape("adamw tensor", {k, sizes[k]}) +
                             (grad_scale != 1.0f ? " scaled" : "");
      // Out of place: the results in the outputs, the inputs as they were.
      const bool out_of_place = !gpu[k].master_out.empty();
      expect_same(sh + " master", out_of_place ? gpu[k].master_out : gpu[k].master, want[k].master);
      expect_same(sh + " m", out_of_place ? gpu[k].m_out : gpu[k].m, want[k].m);
      expect_same(sh + " v", out_of_place ? gpu[k].v_out : gpu[k].v, want[k].v);
      if (out_of_place) {
        expect_same(sh + " master in", gpu[k].master, random_floats(sizes[k], 30 + k));
        expect_same(sh + " m in", gpu[k].m, random_floats(sizes[k], 60 + k, 0.1f));
      }
      expect_same(sh + " copy f32", gpu[k].copy_f32, want[k].copy_f32);
      expect_same(sh + " copy bf16", gpu[k].copy_b, want[k].copy_b);
    }
  }
}

// A tensor whose arrays start one element past a pack (a slice of a flat
// buffer can): one element at a time, the same bits as the same tensor
// aligned, which goes by packs.
TEST_P(CudaKernels, AdamWUnalignedTensorsGiveTheSameBits) {
  const int64_t n = 1001;
  for (bool half : {false, true}) {
    struct Arrays {
      std::vector<float> master, m, v, grad, copy_f32;
      std::vector<bf16> grad_b, copy_b;
    };
    Arrays a[2];  // [0] aligned, [1] one element in
    for (int off = 0; off < 2; ++off) {
      Arrays& x = a[off];
      auto at = [&](uint32_t seed, float scale) {
        std::vector<float> v = random_floats(n, seed, scale);
        v.insert(v.begin(), off, 0.0f);
        return v;
      };
      x.master = at(1, 1.0f), x.m = at(2, 0.1f), x.v = at(3, 0.01f), x.grad = at(4, 1.0f);
      for (float& e : x.v) e = e * e;
      x.grad_b = to_bf16_host(x.grad);
      x.copy_f32.assign(n + off, 0.0f);
      x.copy_b.assign(n + off, 0);
      const cuda::AdamWTensor t{
          x.master.data() + off,
          x.m.data() + off,
          x.v.data() + off,
          x.master.data() + off,
          x.m.data() + off,
          x.v.data() + off,
          half ? static_cast<const void*>(x.grad_b.data() + off) : x.grad.data() + off,
          half ? static_cast<void*>(x.copy_b.data() + off) : x.copy_f32.data() + off,
          n,
          half,
          half,
          0.1f};
      const cuda::AdamWHyper hyper{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.05f, 0.5f, nullptr};
      cuda::adamw(&t, 1, hyper, nullptr);
      for (auto* v : {&x.master, &x.m, &x.v, &x.copy_f32}) v->erase(v->begin(), v->begin() + off);
      x.copy_b.erase(x.copy_b.begin(), x.copy_b.begin() + off);
    }
    const std::string sh = std::string("adamw unaligned") + (half ? " bf16" : " f32");
    expect_same(sh + " master", a[1].master, a[0].master);
    expect_same(sh + " m", a[1].m, a[0].m);
    expect_same(sh + " v", a[1].v, a[0].v);
    expect_same(sh + " copy f32", a[1].copy_f32, a[0].copy_f32);
    expect_same(sh + " copy bf16", a[1].copy_b, a[0].copy_b);
  }
}

}  // namespace
