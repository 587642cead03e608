// The CPU backend: its fp32 kernels are the kernels/cpu functions bit for bit,
// its bf16 conversions and bf16 kernels match references written here, its
// checks turn bad views into Errors, and its memory counters follow alloc/free.
#include "backend/cpu_backend.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/common/math.h"
#include "kernels/cpu/ops.h"
#include "model/layout.h"

namespace amsp::backend {
namespace {

namespace k = amsp::kernels;
using Floats = std::vector<float>;
using Halves = std::vector<uint16_t>;
using Ints = std::vector<int32_t>;

Floats randn(int64_t n, uint64_t stream, float scale = 1.0f) {
  Floats v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(random_normal(11, stream, i));
  return v;
}

Ints random_tokens(int64_t n, int64_t vocab, uint64_t stream) {
  Ints t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>(random_below(11, stream, i, vocab));
  return t;
}

View fv(Floats& x) { return host_view(x.data(), static_cast<int64_t>(x.size())); }
View iv(Ints& x) { return host_view(x.data(), static_cast<int64_t>(x.size())); }
View hv(Halves& x) {
  return View{x.data(), DType::kBF16, static_cast<int64_t>(x.size()), Device::kCpu};
}

Halves to_bf16(const Floats& x) {
  Halves h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = k::float_to_bf16(x[i]);
  return h;
}
Floats widened(const Halves& h) {
  Floats x(h.size());
  for (size_t i = 0; i < h.size(); ++i) x[i] = k::bf16_to_float(h[i]);
  return x;
}

Floats rounded(const Floats& x) {
  Floats r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = k::round_bf16(x[i]);
  return r;
}

uint32_t bits(float f) { return k::float_to_bits(f); }
float from_bits(uint32_t u) { return k::bits_to_float(u); }

// Equal bit patterns, element by element; names the first difference.
::testing::AssertionResult same_bits(const Floats& a, const Floats& b) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << "sizes " << a.size() << " and " << b.size();
  for (size_t i = 0; i < a.size(); ++i)
    if (bits(a[i]) != bits(b[i]))
      return ::testing::AssertionFailure()
             << "element " << i << ": " << a[i] << " vs " << b[i] << " (of " << a.size() << ")";
  return ::testing::AssertionSuccess();
}
::testing::AssertionResult same_bits(const Halves& a, const Halves& b) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << "sizes " << a.size() << " and " << b.size();
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i])
      return ::testing::AssertionFailure() << "element " << i << ": " << std::hex << a[i] << " vs "
                                           << b[i] << " (of " << a.size() << ")";
  return ::testing::AssertionSuccess();
}

// The message of the amsp::Error that f throws; "" if it throws none.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_ERROR(statement, ...)                                                          \
  do {                                                                                        \
    const std::string msg_ = error_of([&] { statement; });                                    \
    EXPECT_FALSE(msg_.empty()) << #statement " did not fail";                                 \
    for (const char* part_ : {__VA_ARGS__})                                                   \
      EXPECT_NE(msg_.find(part_), std::string::npos) << "'" << part_ << "' not in: " << msg_; \
  } while (0)

// ---- views ----------------------------------------------------------------------------

TEST(BackendView, AtIsBoundsChecked) {
  Floats x(10);
  const View v = fv(x);
  const View s = v.at(3, 7);
  EXPECT_EQ(s.data, x.data() + 3);
  EXPECT_EQ(s.count, 7);
  EXPECT_EQ(v.at(10, 0).count, 0);
  Halves h(6);
  EXPECT_EQ(hv(h).at(2, 4).data, h.data() + 2);  // offsets count elements, not bytes
  EXPECT_ERROR(v.at(4, 7), "7 elements", "offset 4", "10 elements");
  EXPECT_ERROR(v.at(-1, 2), "offset -1");
  EXPECT_ERROR(v.at(2, -1), "-1 elements");
  EXPECT_ERROR(v.at(11, 0), "offset 11");
  EXPECT_ERROR(v.at(1, std::numeric_limits<int64_t>::max()), "offset 1");  // no overflow
}

TEST(BackendView, TypedAccessChecksTheDtype) {
  Floats x(4);
  Ints t(4);
  Halves h(4);
  EXPECT_EQ(fv(x).f32(), x.data());
  EXPECT_EQ(iv(t).i32(), t.data());
  EXPECT_EQ(hv(h).bf16(), h.data());
  EXPECT_ERROR(fv(x).bf16(), "bf16", "fp32");
  EXPECT_ERROR(hv(h).f32(), "fp32", "bf16");
  EXPECT_ERROR(fv(x).i32(), "int32", "fp32");
  const Floats& cx = x;
  const View c = host_view(cx.data(), 4);
  EXPECT_EQ(c.dtype, DType::kF32);
  EXPECT_EQ(c.bytes(), 16);
}

// ---- memory, ordering, description ---------------------------------------------------------

TEST(CpuBackend, MemoryStatsFollowAllocAndFree) {
  CpuBackend be(DType::kF32);
  EXPECT_EQ(be.memory().in_use, 0);
  Buffer a = be.alloc(DType::kF32, 100);
  EXPECT_EQ(be.memory().in_use, 400);
  EXPECT_EQ(be.memory().peak, 400);
  {
    Buffer b = be.alloc(DType::kBF16, 51);
    EXPECT_EQ(be.memory().in_use, 502);
    EXPECT_EQ(be.memory().peak, 502);
    Buffer moved = std::move(b);  // moving does not count twice, nor free
    EXPECT_EQ(be.memory().in_use, 502);
  }
  EXPECT_EQ(be.memory().in_use, 400);
  EXPECT_EQ(be.memory().peak, 502);
  a = be.alloc(DType::kI32, 10);  // the old buffer is freed by the assignment
  EXPECT_EQ(be.memory().in_use, 40);
  EXPECT_EQ(be.memory().peak, 502);
  Buffer empty = be.alloc(DType::kF32, 0);
  EXPECT_TRUE(empty.view().empty());
  EXPECT_EQ(be.memory().in_use, 40);
  EXPECT_ERROR(be.alloc(DType::kF32, -1), "alloc", "-1");
}

// Host staging: ordinary host memory, counted in memory().host and not in
// in_use (it is no model state).
TEST(CpuBackend, HostStagingIsCountedApart) {
  CpuBackend be(DType::kF32);
  {
    Buffer h = be.alloc_host(10);
    EXPECT_EQ(h.view().device, Device::kCpu);
    h.f32()[9] = 1.5f;
    EXPECT_EQ(be.memory().host, 40);
    EXPECT_EQ(be.memory().in_use, 0);
  }
  EXPECT_EQ(be.memory().host, 0);
}

TEST(CpuBackend, AllocIsZeroedAndAligned) {
  CpuBackend be(DType::kBF16);
  for (DType t : {DType::kF32, DType::kBF16, DType::kI32}) {
    Buffer b = be.alloc(t, 1001);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
    EXPECT_EQ(b.dtype(), t);
    EXPECT_EQ(b.count(), 1001);
    EXPECT_EQ(b.view().device, Device::kCpu);
    const auto* p = static_cast<const unsigned char*>(b.data());
    for (int64_t i = 0; i < b.bytes(); ++i) ASSERT_EQ(p[i], 0) << "byte " << i;
  }
}

TEST(CpuBackend, BufferMayOutliveTheBackend) {
  Buffer b;
  {
    auto be = make_cpu_backend(DType::kF32);
    b = be->alloc(DType::kF32, 8);
  }
  b.f32()[7] = 1.0f;  // still valid; freeing it later must not touch the backend
}

TEST(CpuBackend, DescribeEventsAndCompute) {
  auto be = make_cpu_backend(DType::kBF16);
  EXPECT_EQ(be->device(), Device::kCpu);
  EXPECT_EQ(be->compute(), DType::kBF16);
  const std::string d = be->describe();
  EXPECT_EQ(d.rfind("cpu (OpenBLAS ", 0), 0u) << d;
  EXPECT_NE(d.find(std::to_string(omp_get_max_threads()) + " thread"), std::string::npos) << d;
  const Event e1 = be->record(), e2 = be->record();
  EXPECT_LT(e1.id, e2.id);
  be->wait(e1);
  be->wait(Event{});
  be->synchronize();
  EXPECT_ERROR(be->wait(Event{e2.id + 1}), "wait", "not recorded");
  EXPECT_ERROR(make_cpu_backend(DType::kI32), "int32");
}

TEST(CpuBackend, PeakFlopsIsMeasured) {
  CpuBackend be(DType::kF32);
  const double peak = be.peak_flops();
  EXPECT_GT(peak, 1e8);  // any machine this runs on does 0.1 GFLOP/s
  EXPECT_LT(peak, 1e14);
}

// ---- bf16 conversions --------------------------------------------------------------------

struct Conversion {
  uint32_t f32;
  uint16_t bf16;
  const char* what;
};

// Written out by hand: bf16 keeps the top 16 bits, rounding the low 16 to
// nearest with ties to even.
const Conversion kConversions[] = {
    {0x3F800000, 0x3F80, "1"},
    {0x3F808000, 0x3F80, "1 + 2^-8: tie, to even (down)"},
    {0x3F818000, 0x3F82, "1 + 3 * 2^-8: tie, to even (up)"},
    {0x3F808001, 0x3F81, "just above a tie: up"},
    {0x3F807FFF, 0x3F80, "just below a tie: down"},
    {0xBF818000, 0xBF82, "negative tie, to even"},
    {0xBF808000, 0xBF80, "negative tie, to even (toward zero)"},
    {0x80000000, 0x8000, "-0"},
    {0x7F800000, 0x7F80, "inf"},
    {0xFF800000, 0xFF80, "-inf"},
    {0x7F7FFFFF, 0x7F80, "largest fp32 rounds up to inf"},
    {0x7F7F7FFF, 0x7F7F, "largest value that stays finite"},
    {0x00000001, 0x0000, "smallest denormal rounds to +0"},
    {0x00008000, 0x0000, "denormal tie, to even (0)"},
    {0x00018000, 0x0002, "denormal tie, to even (up)"},
    {0x00010000, 0x0001, "bf16's smallest denormal, exact"},
    {0x007FFFFF, 0x0080, "largest denormal rounds up to the smallest normal"},
    {0x807F8000, 0x8080, "negative denormal tie, to even"},
};

TEST(CpuBackendBf16, ConversionsRoundToNearestEven) {
  CpuBackend be(DType::kF32);
  const size_t n = std::size(kConversions);
  Floats src(n);
  for (size_t i = 0; i < n; ++i) src[i] = from_bits(kConversions[i].f32);
  Halves via_copy(n), via_host(n);
  be.copy(fv(src), hv(via_copy));
  be.from_host(src.data(), hv(via_host));
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(via_copy[i], kConversions[i].bf16) << kConversions[i].what;
    EXPECT_EQ(via_host[i], kConversions[i].bf16) << kConversions[i].what;
  }
  // Widening is exact: the bf16 bits become the top half.
  Floats back(n), back_host(n);
  be.copy(hv(via_copy), fv(back));
  be.to_host(hv(via_copy), back_host.data());
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(bits(back[i]), static_cast<uint32_t>(kConversions[i].bf16) << 16)
        << kConversions[i].what;
    EXPECT_EQ(bits(back_host[i]), bits(back[i]));
  }
  EXPECT_EQ(back[15], std::ldexp(1.0f, -133));  // bf16's smallest denormal, 2^-133
}

TEST(CpuBackendBf16, NaNStaysNaN) {
  CpuBackend be(DType::kF32);
  // A quiet NaN, a signalling NaN whose payload lies in the low half only (plain
  // truncation would make it inf) and a negative NaN.
  Floats src = {from_bits(0x7FC00000), from_bits(0x7F800001), from_bits(0xFFC00001)};
  Halves h(3);
  be.copy(fv(src), hv(h));
  for (uint16_t v : h) EXPECT_TRUE(std::isnan(k::bf16_to_float(v))) << std::hex << v;
  EXPECT_EQ(h[0], 0x7FC0);
  EXPECT_EQ(h[1], 0x7FC0);
  EXPECT_EQ(h[2] & 0x8000, 0x8000);  // sign kept
}

TEST(CpuBackendBf16, CopyAndAddConvert) {
  CpuBackend be(DType::kF32);
  // add into bf16: dst + src in fp32, rounded once. 1 + 2^-9 rounds back to 1,
  // 1 + 3 * 2^-9 to 1 + 2^-7.
  Halves dst = {k::float_to_bf16(1.0f), k::float_to_bf16(1.0f), k::float_to_bf16(-2.0f)};
  Floats src = {std::ldexp(1.0f, -9), 3 * std::ldexp(1.0f, -9), 0.75f};
  be.add(hv(dst), fv(src));
  EXPECT_EQ(k::bf16_to_float(dst[0]), 1.0f);
  EXPECT_EQ(k::bf16_to_float(dst[1]), 1.0f + std::ldexp(1.0f, -7));
  EXPECT_EQ(k::bf16_to_float(dst[2]), -1.25f);
  // fp32 dst, bf16 src: widened and added in fp32.
  const Floats f0 = {0.1f, 0.2f, 0.3f};
  Floats fdst = f0;
  Halves hsrc = to_bf16({1.1f, 2.2f, 3.3f});
  be.add(fv(fdst), hv(hsrc));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(bits(fdst[i]), bits(f0[i] + k::bf16_to_float(hsrc[i])));
  // bf16 + bf16.
  Halves a = to_bf16({1.0f, 3.0f}), b = to_bf16({std::ldexp(1.0f, -8), 1.0f / 3});
  be.add(hv(a), hv(b));
  EXPECT_EQ(a[0], k::float_to_bf16(1.0f + std::ldexp(1.0f, -8)));
  EXPECT_EQ(a[1], k::float_to_bf16(3.0f + k::bf16_to_float(k::float_to_bf16(1.0f / 3))));
  // fp32 + fp32 is kernels::add_inplace; same-dtype copy is exact.
  Floats x = randn(1000, 1), y = randn(1000, 2), y2 = y;
  be.add(fv(y), fv(x));
  k::add_inplace(y2.data(), x.data(), 1000);
  EXPECT_TRUE(same_bits(y, y2));
  Floats z(1000);
  be.copy(fv(y), fv(z));
  EXPECT_TRUE(same_bits(y, z));
  Ints ti = {1, 2, 3}, to(3);
  be.copy(iv(ti), iv(to));
  EXPECT_EQ(to, ti);
  be.fill_zero(fv(z));
  EXPECT_TRUE(same_bits(z, Floats(1000, 0.0f)));
  // Mismatches.
  EXPECT_ERROR(be.copy(fv(x), fv(z).at(0, 999)), "copy", "1000", "999");
  EXPECT_ERROR(be.add(fv(x), fv(z).at(0, 10)), "add", "1000", "10");
  EXPECT_ERROR(be.copy(iv(ti), fv(z).at(0, 3)), "copy", "int32");
  EXPECT_ERROR(be.add(iv(ti), iv(to)), "add", "int32");
  EXPECT_ERROR(be.to_host(iv(ti), z.data()), "to_host", "int32");
  EXPECT_ERROR(be.from_host(ti.data(), fv(z)), "from_host", "fp32", "int32");
  EXPECT_ERROR(be.from_host(z.data(), iv(to)), "from_host", "int32");
  View device = fv(z);
  device.device = Device::kCuda;
  EXPECT_ERROR(be.fill_zero(device), "fill_zero", "cuda");
}

// ---- fp32: the backend is the kernels, bit for bit ---------------------------------------------

// Sum of squares in double over chunks of 16384, chunks summed in order: the
// order the engine's gradient norm has always used, written out as the expectation.
double chunked_sum_squares(const float* x, int64_t n) {
  double total = 0.0;
  for (int64_t lo = 0; lo < n; lo += 16384) {
    double s = 0.0;
    for (int64_t i = lo; i < std::min(n, lo + 16384); ++i) s += static_cast<double>(x[i]) * x[i];
    total += s;
  }
  return total;
}

TEST(CpuBackendF32, SumSquaresIsTheEnginesOrder) {
  CpuBackend be(DType::kF32);
  for (int64_t n : {0, 1, 16384, 16385, 100003}) {
    Floats x = randn(n, 3);
    const double got = be.sum_squares(fv(x)), want = chunked_sum_squares(x.data(), n);
    EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0) << n << ": " << got << " vs " << want;
  }
  // bf16: the widened values in the same order.
  Floats x = randn(40000, 4);
  Halves h = to_bf16(x);
  Floats w = widened(h);
  const double got = be.sum_squares(hv(h)), want = chunked_sum_squares(w.data(), 40000);
  EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0);
}

TEST(CpuBackendF32, Linear) {
  CpuBackend be(DType::kF32);
  const int64_t M = 37, in = 96, out = 80;
  Floats x = randn(M * in, 1), w = randn(out * in, 2, 0.1f), dy = randn(M * out, 3);
  for (float beta : {0.0f, 1.0f, 0.5f}) {
    Floats y = randn(M * out, 4), y2 = y;
    be.linear_forward(fv(x), fv(w), fv(y), M, in, out, beta);
    k::linear_forward(x.data(), w.data(), y2.data(), M, in, out, beta);
    EXPECT_TRUE(same_bits(y, y2)) << "forward, beta " << beta;
    Floats dx = randn(M * in, 5), dx2 = dx;
    be.linear_backward_input(fv(dy), fv(w), fv(dx), M, in, out, beta);
    k::linear_backward_input(dy.data(), w.data(), dx2.data(), M, in, out, beta);
    EXPECT_TRUE(same_bits(dx, dx2)) << "backward input, beta " << beta;
  }
  Floats dw = randn(out * in, 6), dw2 = dw;
  be.linear_backward_weight(fv(dy), fv(x), fv(dw), M, in, out, 1.0f);
  k::linear_backward_weight(dy.data(), x.data(), dw2.data(), M, in, out);
  EXPECT_TRUE(same_bits(dw, dw2));
  // beta 0: written, whatever dw held: the kernel's sum into zeros.
  Floats written = randn(out * in, 7), zeros(out * in, 0.0f);
  be.linear_backward_weight(fv(dy), fv(x), fv(written), M, in, out, 0.0f);
  k::linear_backward_weight(dy.data(), x.data(), zeros.data(), M, in, out);
  EXPECT_TRUE(same_bits(written, zeros));
  EXPECT_ERROR(be.linear_backward_weight(fv(dy), fv(x), fv(dw), M, in, out, 0.5f),
               "linear_backward_weight",
               "beta = 0.5 (expected 0, the gradient written, or 1, added to)");
}

TEST(CpuBackendF32, LinearWithBf16WeightsRunsOnTheWidenedWeights) {
  CpuBackend be(DType::kF32);
  const int64_t M = 9, in = 64, out = 48;
  Floats x = randn(M * in, 1), dy = randn(M * out, 3);
  Halves w = to_bf16(randn(out * in, 2, 0.1f));
  const Floats wf = widened(w);
  Floats y(M * out), y2(M * out), dx(M * in), dx2(M * in);
  be.linear_forward(fv(x), hv(w), fv(y), M, in, out, 0.0f);
  k::linear_forward(x.data(), wf.data(), y2.data(), M, in, out, 0.0f);
  EXPECT_TRUE(same_bits(y, y2));
  be.linear_backward_input(fv(dy), hv(w), fv(dx), M, in, out, 0.0f);
  k::linear_backward_input(dy.data(), wf.data(), dx2.data(), M, in, out, 0.0f);
  EXPECT_TRUE(same_bits(dx, dx2));
  // A bf16 gradient: the fp32 contribution, then one rounding of dw + it.
  Halves dw = to_bf16(randn(out * in, 6));
  Floats c(out * in, 0.0f);
  k::linear_backward_weight(dy.data(), x.data(), c.data(), M, in, out);
  Halves want(out * in);
  for (int64_t i = 0; i < out * in; ++i) want[i] = k::float_to_bf16(k::bf16_to_float(dw[i]) + c[i]);
  be.linear_backward_weight(fv(dy), fv(x), hv(dw), M, in, out, 1.0f);
  EXPECT_TRUE(same_bits(dw, want));
  // Written (beta 0): the contribution rounded once, dw's old values unread.
  for (int64_t i = 0; i < out * in; ++i) want[i] = k::float_to_bf16(c[i]);
  be.linear_backward_weight(fv(dy), fv(x), hv(dw), M, in, out, 0.0f);
  EXPECT_TRUE(same_bits(dw, want));
}

TEST(CpuBackendF32, RmsNorm) {
  for (DType compute : {DType::kF32, DType::kBF16}) {  // norms are fp32 under either
    CpuBackend be(compute);
    const int64_t rows = 21, dim = 72;
    Floats x = randn(rows * dim, 1), w = randn(dim, 2), dy = randn(rows * dim, 3);
    Floats y(rows * dim), y2(rows * dim), inv(rows), inv2(rows);
    be.rmsnorm_forward(fv(x), fv(w), fv(y), fv(inv), rows, dim, 1e-5f);
    k::rmsnorm_forward(x.data(), w.data(), y2.data(), inv2.data(), rows, dim, 1e-5f);
    EXPECT_TRUE(same_bits(y, y2));
    EXPECT_TRUE(same_bits(inv, inv2));
    Floats ya(rows * dim), ya2(rows * dim);
    be.rmsnorm_apply(fv(x), fv(w), fv(inv), fv(ya), rows, dim);
    k::rmsnorm_apply(x.data(), w.data(), inv.data(), ya2.data(), rows, dim);
    EXPECT_TRUE(same_bits(ya, ya2));
    Floats dx = randn(rows * dim, 4), dx2 = dx, dw = randn(dim, 5), dw2 = dw;
    be.rmsnorm_backward(fv(dy), fv(x), fv(w), fv(inv), fv(dx), fv(dw), rows, dim, {}, 1.0f);
    k::rmsnorm_backward(dy.data(), x.data(), w.data(), inv.data(), dx2.data(), dw2.data(), rows,
                        dim);
    EXPECT_TRUE(same_bits(dx, dx2));
    EXPECT_TRUE(same_bits(dw, dw2));
  }
}

TEST(CpuBackendF32, RmsNormWithBf16WeightAndGradient) {
  CpuBackend be(DType::kF32);
  const int64_t rows = 13, dim = 40;
  Floats x = randn(rows * dim, 1), dy = randn(rows * dim, 3);
  Halves w = to_bf16(randn(dim, 2));
  const Floats wf = widened(w);
  Floats y(rows * dim), y2(rows * dim), inv(rows), inv2(rows);
  be.rmsnorm_forward(fv(x), hv(w), fv(y), fv(inv), rows, dim, 1e-6f);
  k::rmsnorm_forward(x.data(), wf.data(), y2.data(), inv2.data(), rows, dim, 1e-6f);
  EXPECT_TRUE(same_bits(y, y2));
  Floats ya(rows * dim);
  be.rmsnorm_apply(fv(x), hv(w), fv(inv), fv(ya), rows, dim);
  EXPECT_TRUE(same_bits(ya, y2));
  Halves dw = to_bf16(randn(dim, 5));
  Floats dx = randn(rows * dim, 4), dx2 = dx, c(dim, 0.0f);
  k::rmsnorm_backward(dy.data(), x.data(), wf.data(), inv.data(), dx2.data(), c.data(), rows, dim);
  Halves want(dim);
  for (int64_t j = 0; j < dim; ++j) want[j] = k::float_to_bf16(k::bf16_to_float(dw[j]) + c[j]);
  be.rmsnorm_backward(fv(dy), fv(x), hv(w), fv(inv), fv(dx), hv(dw), rows, dim, {}, 1.0f);
  EXPECT_TRUE(same_bits(dx, dx2));
  EXPECT_TRUE(same_bits(dw, want));
}

TEST(CpuBackendF32, Rope) {
  CpuBackend be(DType::kF32);
  const int64_t B = 2, T = 7, heads = 3, D = 8, stride = 40, half = D / 2;
  Floats cos(T * half), sin(T * half), cos2(T * half), sin2(T * half);
  be.rope_table(fv(cos), fv(sin), T, D, 10000.0);
  k::rope_table(cos2.data(), sin2.data(), T, D, 10000.0);
  EXPECT_TRUE(same_bits(cos, cos2));
  EXPECT_TRUE(same_bits(sin, sin2));
  Floats x = randn(B * T * stride, 1), x2 = x;
  be.rope_forward(fv(x), fv(cos), fv(sin), B, T, heads, D, stride);
  k::rope_forward(x2.data(), cos.data(), sin.data(), B, T, heads, D, stride);
  EXPECT_TRUE(same_bits(x, x2));
  be.rope_backward(fv(x), fv(cos), fv(sin), B, T, heads, D, stride);
  k::rope_backward(x2.data(), cos.data(), sin.data(), B, T, heads, D, stride);
  EXPECT_TRUE(same_bits(x, x2));
  // The last row needs only its heads, not a whole stride.
  Floats tight((B * T - 1) * stride + heads * D);
  be.rope_forward(fv(tight), fv(cos), fv(sin), B, T, heads, D, stride);
  EXPECT_ERROR(
      be.rope_forward(fv(tight).at(0, tight.size() - 1), fv(cos), fv(sin), B, T, heads, D, stride),
      "rope_forward", "x holds");
  EXPECT_ERROR(be.rope_table(fv(cos), fv(sin), T, 7, 10000.0), "rope_table", "odd");
  EXPECT_ERROR(be.rope_forward(fv(x), fv(cos), fv(sin), B, T, 6, D, stride), "rope_forward",
               "do not fit");
  EXPECT_ERROR(be.rope_backward(fv(x), fv(cos).at(0, 4), fv(sin), B, T, heads, D, stride),
               "rope_backward", "cos holds");
}

// Attention is the fp32 kernel on its inputs, rounded to bf16 first when the
// products take bf16 (compute() == kBF16), to the bit either way.
TEST(CpuBackendF32, Attention) {
  const int64_t B = 2, T = 70, H = 4, KV = 2, D = 8;  // 70 crosses the kernel's 64-row block
  const int64_t N = B * T, lq = H * D, lk = KV * D, ld = lq + 2 * lk;
  Floats qkv = randn(N * ld, 1), dout = randn(N * lq, 4);
  for (DType compute : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(compute));
    CpuBackend be(compute);
    EXPECT_EQ(be.attention_saved_count(B, T, H), B * H * T * T);
    const bool bf16 = compute == DType::kBF16;
    const Floats in = bf16 ? rounded(qkv) : qkv, dr = bf16 ? rounded(dout) : dout;
    Floats p(be.attention_saved_count(B, T, H)), p2(p.size()), o(N * lq), o2(N * lq);
    be.attention_forward(fv(qkv), fv(p), fv(o), B, T, H, KV, D);
    k::attention_forward(in.data(), in.data() + lq, in.data() + lq + lk, ld, ld, p2.data(),
                         o2.data(), B, T, H, KV, D);
    EXPECT_TRUE(same_bits(o, o2));
    EXPECT_TRUE(same_bits(p, p2));
    Floats d(N * ld), d2(N * ld);
    View no_out;  // backward does not read the forward's output
    be.attention_backward(fv(qkv), {}, fv(p), no_out, fv(dout), fv(d), B, T, H, KV, D);
    k::attention_backward(in.data(), in.data() + lq, in.data() + lq + lk, ld, ld, {}, p.data(),
                          dr.data(), d2.data(), d2.data() + lq, d2.data() + lq + lk, B, T, H, KV,
                          D);
    EXPECT_TRUE(same_bits(d, d2));
  }
  CpuBackend be(DType::kF32);
  Floats p(be.attention_saved_count(B, T, H)), o(N * lq), d(N * ld);
  View no_out;
  EXPECT_ERROR(be.attention_forward(fv(qkv), fv(p).at(0, p.size() - 1), fv(o), B, T, H, KV, D),
               "attention_forward", "saved holds");
  EXPECT_ERROR(be.attention_forward(fv(qkv), fv(p), fv(o), B, T, H, 3, D), "attention_forward",
               "kv heads");
  EXPECT_ERROR(be.attention_forward(fv(qkv).at(0, N * ld - 1), fv(p), fv(o), B, T, H, KV, D),
               "attention_forward", "qkv holds");
  EXPECT_ERROR(be.attention_backward(fv(qkv), {}, fv(p), no_out, fv(dout), fv(d).at(0, N * ld - 1),
                                     B, T, H, KV, D),
               "attention_backward", "dqkv holds");
}

// Attention's backward with rope tables is the backward without them and
// then rope_backward on dq and dk, to the bit (fp32): the same rotation of
// each pair, done as the gradients are written rather than by a pass of its
// own; dv is the same. Tables shorter than the sequence, or not fp32, are
// refused.
TEST(CpuBackendF32, AttentionRotatesGradientsBack) {
  const int64_t B = 2, T = 70, H = 4, KV = 2, D = 8;
  const int64_t N = B * T, lq = H * D, lk = KV * D, ld = lq + 2 * lk;
  CpuBackend be(DType::kF32);
  Floats cos(T * D / 2), sin(T * D / 2);
  be.rope_table(fv(cos), fv(sin), T, D, 10000.0);
  const RopeTables rope{fv(cos), fv(sin)};
  Floats qkv = randn(N * ld, 1), dout = randn(N * lq, 4);
  be.rope_forward(fv(qkv), fv(cos), fv(sin), B, T, H + KV, D, ld);
  Floats p(be.attention_saved_count(B, T, H)), o(N * lq), d(N * ld), d2(N * ld);
  View no_out;
  be.attention_forward(fv(qkv), fv(p), fv(o), B, T, H, KV, D);
  be.attention_backward(fv(qkv), rope, fv(p), no_out, fv(dout), fv(d), B, T, H, KV, D);
  be.attention_backward(fv(qkv), {}, fv(p), no_out, fv(dout), fv(d2), B, T, H, KV, D);
  be.rope_backward(fv(d2), fv(cos), fv(sin), B, T, H + KV, D, ld);
  EXPECT_TRUE(same_bits(d, d2));
  EXPECT_ERROR(be.attention_backward(fv(qkv), {fv(cos).at(0, (T - 1) * D / 2), fv(sin)}, fv(p),
                                     no_out, fv(dout), fv(d), B, T, H, KV, D),
               "attention_backward", "rope cos holds");
  Halves half_sin(T * D / 2);
  EXPECT_ERROR(be.attention_backward(fv(qkv), {fv(cos), hv(half_sin)}, fv(p), no_out, fv(dout),
                                     fv(d), B, T, H, KV, D),
               "attention_backward", "rope sin is bf16");
}

// The backend's fused gate/up rows against the kernel on gate and up taken
// apart into buffers of their own.
TEST(CpuBackendF32, SwiGlu) {
  CpuBackend be(DType::kF32);
  const int64_t rows = 50, I = 100, n = rows * I;
  Floats gu = randn(2 * n, 1, 3.0f), dout = randn(n, 3), g(n), u(n);
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(gu.begin() + r * 2 * I, I, g.begin() + r * I);
    std::copy_n(gu.begin() + r * 2 * I + I, I, u.begin() + r * I);
  }
  Floats o(n), o2(n);
  be.swiglu_forward(fv(gu), fv(o), rows, I);
  k::swiglu_forward(g.data(), u.data(), I, o2.data(), rows, I);
  EXPECT_TRUE(same_bits(o, o2));
  Floats d(2 * n), dg(n), du(n);
  be.swiglu_backward(fv(gu), fv(dout), fv(d), rows, I);
  k::swiglu_backward(g.data(), u.data(), I, dout.data(), dg.data(), du.data(), rows, I);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < I; ++c) {
      ASSERT_EQ(bits(d[r * 2 * I + c]), bits(dg[r * I + c])) << r << " " << c;
      ASSERT_EQ(bits(d[r * 2 * I + I + c]), bits(du[r * I + c])) << r << " " << c;
    }
  EXPECT_ERROR(be.swiglu_forward(fv(gu), fv(o).at(0, n - 1), rows, I), "swiglu_forward",
               "out holds");
  EXPECT_ERROR(be.swiglu_backward(fv(gu).at(0, 3), fv(dout), fv(d), rows, I), "swiglu_backward",
               "gate_up holds 3");
}

// bf16 activations: each output is the fp32 kernel's result on the widened
// inputs, rounded once to nearest even (computed here from the fp32 kernel).
// Views of mixed dtypes are refused, naming the view and the dtype expected.
TEST(CpuBackendBf16, SwiGluOnBf16ActivationsRoundsTheFp32ResultOnce) {
  CpuBackend be(DType::kBF16);
  const int64_t rows = 30, I = 70, n = rows * I;
  Halves gu = to_bf16(randn(2 * n, 1, 3.0f)), dout = to_bf16(randn(n, 3)), o(n), d(2 * n);
  be.swiglu_forward(hv(gu), hv(o), rows, I);
  be.swiglu_backward(hv(gu), hv(dout), hv(d), rows, I);
  Floats wide = widened(gu), wdout = widened(dout), want_o(n), want_d(2 * n);
  k::swiglu_forward(wide.data(), wide.data() + I, 2 * I, want_o.data(), rows, I);
  k::swiglu_backward(wide.data(), wide.data() + I, 2 * I, wdout.data(), want_d.data(), want_d.data() + I, rows, I);
  EXPECT_EQ(o, to_bf16(want_o));
  EXPECT_EQ(d, to_bf16(want_d));
  Floats f(n);
  EXPECT_ERROR(be.swiglu_forward(hv(gu), fv(f), rows, I), "swiglu_forward",
               "out is fp32, expected bf16 as gate_up is");
  EXPECT_ERROR(be.swiglu_backward(hv(gu), fv(f), hv(d), rows, I), "swiglu_backward",
               "dout is fp32, expected bf16 as gate_up is");
}

// RoPE on bf16 values in place: each pair widened, rotated as the fp32 kernel
// rotates it, and rounded once, forward and backward.
TEST(CpuBackendBf16, RopeOnBf16ValuesRoundsTheFp32RotationOnce) {
  CpuBackend be(DType::kBF16);
  const int64_t B = 2, T = 9, heads = 3, hd = 8, stride = 30, n = B * T * stride;
  Floats cs(T * hd / 2), sn(T * hd / 2);
  k::rope_table(cs.data(), sn.data(), T, hd, 10000.0);
  Halves x = to_bf16(randn(n, 4));
  Floats want = widened(x);
  be.rope_forward(hv(x), fv(cs), fv(sn), B, T, heads, hd, stride);
  k::rope_forward(want.data(), cs.data(), sn.data(), B, T, heads, hd, stride);
  EXPECT_EQ(x, to_bf16(want));
  want = widened(x);
  be.rope_backward(hv(x), fv(cs), fv(sn), B, T, heads, hd, stride);
  k::rope_backward(want.data(), cs.data(), sn.data(), B, T, heads, hd, stride);
  EXPECT_EQ(x, to_bf16(want));
}

// RMSNorm with bf16 activations: y (forward and apply) is the fp32 kernel's y
// rounded once; a bf16 dy gives what the fp32 kernel gives on the widened dy.
// x, dx and inv_rms stay fp32 (the residual stream).
TEST(CpuBackendBf16, RmsnormOnBf16ActivationsRoundsYAndWidensDy) {
  CpuBackend be(DType::kBF16);
  const int64_t rows = 20, dim = 70, n = rows * dim;
  Floats x = randn(n, 1, 3.0f), w = randn(dim, 2), inv(rows), inv_want(rows), y_want(n);
  Halves y(n), y2(n);
  be.rmsnorm_forward(fv(x), fv(w), hv(y), fv(inv), rows, dim, 1e-5f);
  k::rmsnorm_forward(x.data(), w.data(), y_want.data(), inv_want.data(), rows, dim, 1e-5f);
  EXPECT_EQ(y, to_bf16(y_want));
  EXPECT_TRUE(same_bits(inv, inv_want));
  be.rmsnorm_apply(fv(x), fv(w), fv(inv), hv(y2), rows, dim);
  EXPECT_EQ(y2, y);
  Halves dy = to_bf16(randn(n, 3));
  Floats dx = randn(n, 4), dw = randn(dim, 5), dx_want = dx, dw_want = dw, wide = widened(dy);
  be.rmsnorm_backward(hv(dy), fv(x), fv(w), fv(inv), fv(dx), fv(dw), rows, dim, {}, 1.0f);
  k::rmsnorm_backward(wide.data(), x.data(), w.data(), inv.data(), dx_want.data(), dw_want.data(), rows, dim);
  EXPECT_TRUE(same_bits(dx, dx_want));
  EXPECT_TRUE(same_bits(dw, dw_want));
  Halves dx16(n);
  EXPECT_ERROR(
      be.rmsnorm_backward(hv(dy), fv(x), fv(w), fv(inv), hv(dx16), fv(dw), rows, dim, {}, 1.0f),
      "rmsnorm_backward", "dx is bf16, expected fp32");
}

// The products on bf16 activations (bf16 compute): each output is what the same
// call gives on the widened values into fp32, stored rounded: with beta 0 the
// product rounded once (already a bf16 value), with beta 1 the fp32 sum rounded.
// The weight gradient from bf16 dy and x is the one from their widened values.
// Under fp32 compute bf16 activations are refused.
TEST(CpuBackendBf16, LinearOnBf16ActivationsEqualsTheWidenedCallRounded) {
  CpuBackend be(DType::kBF16);
  const int64_t M = 9, in = 40, out = 33;
  const Floats w = randn(out * in, 2, 0.2f);
  Floats wcopy = w;
  for (float beta : {0.0f, 1.0f}) {
    Halves x = to_bf16(randn(M * in, 1)), y = to_bf16(randn(M * out, 3));
    Floats xw = widened(x), yw = widened(y);
    be.linear_forward(hv(x), fv(wcopy), hv(y), M, in, out, beta);
    be.linear_forward(fv(xw), fv(wcopy), fv(yw), M, in, out, beta);
    EXPECT_EQ(y, to_bf16(yw)) << "forward, beta " << beta;
    Halves dy = to_bf16(randn(M * out, 4)), dx = to_bf16(randn(M * in, 5));
    Floats dyw = widened(dy), dxw = widened(dx);
    be.linear_backward_input(hv(dy), fv(wcopy), hv(dx), M, in, out, beta);
    be.linear_backward_input(fv(dyw), fv(wcopy), fv(dxw), M, in, out, beta);
    EXPECT_EQ(dx, to_bf16(dxw)) << "backward input, beta " << beta;
    Floats dw(out * in, 0.5f), dw2 = dw;
    be.linear_backward_weight(hv(dy), hv(x), fv(dw), M, in, out, 1.0f);
    be.linear_backward_weight(fv(dyw), fv(xw), fv(dw2), M, in, out, 1.0f);
    EXPECT_TRUE(same_bits(dw, dw2)) << "backward weight";
  }
  CpuBackend f32(DType::kF32);
  Halves x(M * in), y(M * out);
  EXPECT_ERROR(f32.linear_forward(hv(x), fv(wcopy), hv(y), M, in, out, 0.0f), "linear_forward",
               "x is bf16, expected fp32 (bf16 activations need bf16 compute)");
}

// Attention on bf16 activations (q|k|v, out, dout, dqkv), under either compute:
// the call on the widened values, each output rounded once; and a bf16 output
// beside fp32 inputs is refused, naming it.
TEST(CpuBackendBf16, AttentionOnBf16ActivationsRoundsEachOutputOnce) {
  const int64_t B = 2, T = 70, H = 4, KV = 2, D = 8;
  const int64_t N = B * T, lq = H * D, ld = lq + 2 * KV * D;
  Floats cos(T * D / 2), sin(T * D / 2);
  k::rope_table(cos.data(), sin.data(), T, D, 10000.0);
  for (auto [compute, rope] : {std::pair{DType::kF32, RopeTables{}},
                               {DType::kBF16, RopeTables{}},
                               {DType::kF32, RopeTables{fv(cos), fv(sin)}},
                               {DType::kBF16, RopeTables{fv(cos), fv(sin)}}}) {
    SCOPED_TRACE(std::string(dtype_name(compute)) + (rope.cos.empty() ? "" : ", rope"));
    CpuBackend be(compute);
    Halves qkv = to_bf16(randn(N * ld, 1)), dout = to_bf16(randn(N * lq, 4));
    Floats qkvw = widened(qkv), doutw = widened(dout);
    Floats p(be.attention_saved_count(B, T, H)), p2(p.size());
    Halves o(N * lq), d(N * ld);
    Floats ow(N * lq), dw(N * ld);
    be.attention_forward(hv(qkv), fv(p), hv(o), B, T, H, KV, D);
    be.attention_forward(fv(qkvw), fv(p2), fv(ow), B, T, H, KV, D);
    EXPECT_TRUE(same_bits(p, p2));
    EXPECT_EQ(o, to_bf16(ow));
    be.attention_backward(hv(qkv), rope, fv(p), hv(o), hv(dout), hv(d), B, T, H, KV, D);
    be.attention_backward(fv(qkvw), rope, fv(p), fv(ow), fv(doutw), fv(dw), B, T, H, KV, D);
    EXPECT_EQ(d, to_bf16(dw));
  }
  CpuBackend be(DType::kBF16);
  Floats qkv = randn(N * ld, 1), p(be.attention_saved_count(B, T, H));
  Halves o(N * lq);
  EXPECT_ERROR(be.attention_forward(fv(qkv), fv(p), hv(o), B, T, H, KV, D), "attention_forward",
               "out is bf16, expected fp32 as qkv is");
}

// Cross-entropy on bf16 logits: the loss and lse of the widened logits, and each
// entry of the gradient the fp32 kernel's rounded once (the target's entry
// whole, not its two steps rounded apart).
TEST(CpuBackendBf16, CrossEntropyOnBf16LogitsRoundsTheGradientOnce) {
  CpuBackend be(DType::kBF16);
  const int64_t rows = 12, V = 50;
  Halves z = to_bf16(randn(rows * V, 1, 2.0f));
  Ints t = random_tokens(rows, V, 2);
  t[3] = -100;
  Floats lse(rows), want_lse(rows), wide = widened(z);
  const LossSum loss = be.cross_entropy_forward(hv(z), iv(t), fv(lse), rows, V);
  int64_t count = 0;
  const double want = k::cross_entropy_forward(wide.data(), t.data(), want_lse.data(), rows, V, &count);
  EXPECT_EQ(loss.sum, want);
  EXPECT_EQ(loss.count, count);
  EXPECT_TRUE(same_bits(lse, want_lse));
  be.cross_entropy_backward(hv(z), iv(t), fv(lse), rows, V, 0.25f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < V; ++j) {
      float g = 0.0f;
      if (t[r] >= 0) {
        g = 0.25f * k::fast_exp(wide[r * V + j] - lse[r]);
        if (j == t[r]) g = g - 0.25f;
      }
      ASSERT_EQ(z[r * V + j], k::float_to_bf16(g)) << r << " " << j;
    }
}

TEST(CpuBackendF32, CrossEntropy) {
  CpuBackend be(DType::kF32);
  const int64_t rows = 12, V = 50;
  Floats z = randn(rows * V, 1, 2.0f), z2 = z;
  Ints t = random_tokens(rows, V, 2);
  t[3] = -100;  // ignored
  Floats lse(rows), lse2(rows);
  const LossSum got = be.cross_entropy_forward(fv(z), iv(t), fv(lse), rows, V);
  int64_t count = 0;
  const double want = k::cross_entropy_forward(z2.data(), t.data(), lse2.data(), rows, V, &count);
  EXPECT_EQ(std::memcmp(&got.sum, &want, sizeof want), 0);
  EXPECT_EQ(got.count, count);
  EXPECT_EQ(got.count, rows - 1);
  EXPECT_TRUE(same_bits(lse, lse2));
  be.cross_entropy_backward(fv(z), iv(t), fv(lse), rows, V, 0.25f);
  k::cross_entropy_backward(z2.data(), t.data(), lse2.data(), rows, V, 0.25f);
  EXPECT_TRUE(same_bits(z, z2));
  t[5] = static_cast<int32_t>(V);
  EXPECT_ERROR(be.cross_entropy_forward(fv(z), iv(t), fv(lse), rows, V), "target 50");
  EXPECT_ERROR(be.cross_entropy_backward(fv(z), iv(t), fv(lse), rows, V, 1.0f),
               "cross_entropy_backward", "target 50");
  t[5] = 0;
  EXPECT_ERROR(be.cross_entropy_forward(fv(z), fv(lse), fv(lse), rows, V), "cross_entropy_forward",
               "targets is fp32");
  EXPECT_ERROR(be.cross_entropy_forward(fv(z).at(0, rows * V - 1), iv(t), fv(lse), rows, V),
               "cross_entropy_forward", "logits holds");
}

TEST(CpuBackendF32, Embedding) {
  CpuBackend be(DType::kF32);
  const int64_t rows = 300, dim = 24, vocab = 17;
  Floats table = randn(vocab * dim, 1), dout = randn(rows * dim, 2);
  Ints t = random_tokens(rows, vocab, 3);
  Floats o(rows * dim), o2(rows * dim);
  be.embedding_forward(iv(t), fv(table), fv(o), rows, dim);
  k::embedding_forward(t.data(), table.data(), o2.data(), rows, dim);
  EXPECT_TRUE(same_bits(o, o2));
  Floats d = randn(vocab * dim, 4), d2 = d;
  be.embedding_backward(iv(t), fv(dout), fv(d), rows, dim);
  k::embedding_backward(t.data(), dout.data(), d2.data(), rows, dim);
  EXPECT_TRUE(same_bits(d, d2));
  // A bf16 table is widened.
  Halves ht = to_bf16(table);
  const Floats wt = widened(ht);
  be.embedding_forward(iv(t), hv(ht), fv(o), rows, dim);
  k::embedding_forward(t.data(), wt.data(), o2.data(), rows, dim);
  EXPECT_TRUE(same_bits(o, o2));
  // Tokens outside the table are Errors, not reads past it.
  t[7] = static_cast<int32_t>(vocab);
  EXPECT_ERROR(be.embedding_forward(iv(t), fv(table), fv(o), rows, dim), "embedding_forward",
               "token 17 at row 7", "17 rows");
  t[7] = -1;
  EXPECT_ERROR(be.embedding_backward(iv(t), fv(dout), hv(ht), rows, dim), "embedding_backward",
               "token -1");
  t[7] = 0;
  EXPECT_ERROR(be.embedding_forward(fv(o), fv(table), fv(o), rows, dim), "embedding_forward",
               "tokens is fp32");
  EXPECT_ERROR(be.embedding_forward(iv(t), iv(t), fv(o), rows, dim), "embedding_forward",
               "table is int32");
}

// The expectation: the gradient scaled in place when clipping, then the
// reference kernel kernels::adamw_update (bias corrections from fp32 betas).
void engine_adamw(Floats& p, Floats& m, Floats& v, Floats g, double lr, float grad_scale,
                  int64_t step) {
  const int64_t n = static_cast<int64_t>(p.size());
  if (grad_scale != 1.0f)
    for (float& x : g) x *= grad_scale;
  k::adamw_update(p.data(), m.data(), v.data(), g.data(), n, static_cast<float>(lr), 0.9f, 0.95f,
                  1e-8f, 0.1f, step);
}

// The same step for the backend, with the reference kernel's bias corrections.
AdamWStep engine_step(double lr, float grad_scale, int64_t step) {
  AdamWStep s;
  s.lr = static_cast<float>(lr);
  s.beta1 = 0.9f;
  s.beta2 = 0.95f;
  s.eps = 1e-8f;
  s.weight_decay = 0.1f;
  s.bias_correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(0.9f), step));
  s.bias_correction2 = static_cast<float>(1.0 - std::pow(static_cast<double>(0.95f), step));
  s.grad_scale = grad_scale;
  return s;
}

TEST(CpuBackendF32, AdamWIsTheEnginesUpdate) {
  CpuBackend be(DType::kF32);
  const int64_t n = 10007;
  Floats p = randn(n, 1), m = randn(n, 2, 0.1f), v = randn(n, 3, 0.1f), g = randn(n, 4);
  for (float& x : v) x = x * x;
  for (float scale : {1.0f, 0.37f}) {
    Floats p2 = p, m2 = m, v2 = v;
    engine_adamw(p2, m2, v2, g, 3e-3, scale, 3);
    for (DType copy_dtype : {DType::kF32, DType::kBF16, DType::kI32 /* none */}) {
      Floats p1 = p, m1 = m, v1 = v, copy(n);
      Halves hcopy(n);
      const View cv = copy_dtype == DType::kF32    ? fv(copy)
                      : copy_dtype == DType::kBF16 ? hv(hcopy)
                                                   : View{};
      be.adamw(fv(p1), fv(m1), fv(v1), fv(g), cv, engine_step(3e-3, scale, 3));
      EXPECT_TRUE(same_bits(p1, p2)) << "scale " << scale << ", copy " << dtype_name(copy_dtype);
      EXPECT_TRUE(same_bits(m1, m2));
      EXPECT_TRUE(same_bits(v1, v2));
      if (copy_dtype == DType::kF32) EXPECT_TRUE(same_bits(copy, p1));
      if (copy_dtype == DType::kBF16) EXPECT_TRUE(same_bits(hcopy, to_bf16(p1)));
    }
  }
  // kernels::adamw_update, whose bias corrections come from the fp32 betas.
  AdamWStep s = engine_step(3e-3, 1.0f, 3);
  s.bias_correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(0.9f), 3));
  s.bias_correction2 = static_cast<float>(1.0 - std::pow(static_cast<double>(0.95f), 3));
  Floats p1 = p, m1 = m, v1 = v, p2 = p, m2 = m, v2 = v;
  be.adamw(fv(p1), fv(m1), fv(v1), fv(g), View{}, s);
  k::adamw_update(p2.data(), m2.data(), v2.data(), g.data(), n, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3);
  EXPECT_TRUE(same_bits(p1, p2));
  EXPECT_TRUE(same_bits(m1, m2));
  EXPECT_TRUE(same_bits(v1, v2));
}

TEST(CpuBackendBf16, AdamWWithBf16GradAndCopy) {
  CpuBackend be(DType::kBF16);
  const int64_t n = 5003;
  Floats p = randn(n, 1), m = randn(n, 2, 0.1f), v = randn(n, 3, 0.1f);
  for (float& x : v) x = x * x;
  Halves g = to_bf16(randn(n, 4));
  const AdamWStep s = engine_step(1e-3, 0.5f, 7);
  Floats p1 = p, m1 = m, v1 = v;
  Halves copy(n, 0xFFFF);
  be.adamw(fv(p1), fv(m1), fv(v1), hv(g), hv(copy), s);
  // Reference: the engine's update on the widened gradient; the master rounded.
  engine_adamw(p, m, v, widened(g), 1e-3, 0.5f, 7);
  EXPECT_TRUE(same_bits(p1, p));
  EXPECT_TRUE(same_bits(m1, m));
  EXPECT_TRUE(same_bits(v1, v));
  EXPECT_TRUE(same_bits(copy, to_bf16(p)));
  EXPECT_ERROR(be.adamw(fv(p1), fv(m1), fv(v1), hv(g), hv(copy).at(0, n - 1), s), "adamw",
               "param_copy holds");
  EXPECT_ERROR(be.adamw(fv(p1), fv(m1).at(0, 5), fv(v1), hv(g), View{}, s), "adamw", "m holds 5");
  EXPECT_ERROR(be.adamw(hv(g), fv(m1), fv(v1), hv(g), View{}, s), "adamw", "master is bf16");
}

// ---- bf16 matrix products --------------------------------------------------------------------

// The reference of a bf16 matrix product written out: C[r, c] = round_bf16(sum
// over k of a(r, k) * b(c, k)) with a and b already rounded to bf16; the sum is
// exact (double: bf16 x bf16 products have 16 significant bits, and the sums
// here stay far inside double's 53).
// With round = false, the sum as it is (in fp32: exact for the inputs of the
// tests below).
template <typename A, typename B>
Floats bf16_product(int64_t rows, int64_t cols, int64_t K, A a, B b, bool round = true) {
  Floats c(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      double s = 0;
      for (int64_t i = 0; i < K; ++i) s += static_cast<double>(a(r, i)) * b(j, i);
      c[r * cols + j] = round ? k::round_bf16(static_cast<float>(s)) : static_cast<float>(s);
    }
  return c;
}

// Values whose bf16 roundings are multiples of 1/8 in [-15/8, 15/8]: fp32 values
// near k/8, off by less than half a bf16 ulp, so the backend must round them
// to get k/8. Products are multiples of 1/64 below 4 in magnitude; a sum of up
// to 256 of them is a multiple of 1/64 below 1024, 16 significant bits: every
// partial sum is exact in fp32, in any order, so sgemm's result is exact and
// the bf16 product can be compared bit for bit with the reference.
Floats near_eighths(int64_t n, uint64_t stream) {
  Floats x(n);
  for (int64_t i = 0; i < n; ++i) {
    const float grid =
        static_cast<float>(static_cast<int64_t>(random_below(11, stream, i, 31)) - 15) / 8;
    const float wiggle = static_cast<float>(random_uniform(11, stream + 1000, i) * 2 - 1);
    x[i] = grid * (1.0f + wiggle * std::ldexp(1.0f, -10));  // |relative error| < 2^-10 < half ulp
  }
  return x;
}

TEST(CpuBackendBf16, LinearExactAccumulationMatchesTheReference) {
  CpuBackend be(DType::kBF16);
  const int64_t M = 40, in = 96, out = 72;  // every K <= 256
  Floats x = near_eighths(M * in, 1), w = near_eighths(out * in, 2), dy = near_eighths(M * out, 3);
  const Floats xr = rounded(x), wr = rounded(w), dyr = rounded(dy);
  ASSERT_FALSE(same_bits(x, xr));  // the inputs do need rounding
  // beta * y is exact for these betas, so the reference does not depend on
  // whether the compiler fuses the multiply-add.
  for (float beta : {0.0f, 1.0f, -0.5f}) {
    // y = round(x) round(W)^T + beta y, in fp32 (an fp32 y is not rounded)
    const Floats y0 = randn(M * out, 4);
    Floats y = y0;
    Floats want = bf16_product(
        M, out, in, [&](int64_t r, int64_t i) { return xr[r * in + i]; },
        [&](int64_t c, int64_t i) { return wr[c * in + i]; }, false);
    if (beta != 0.0f)
      for (int64_t i = 0; i < M * out; ++i) want[i] = want[i] + beta * y0[i];
    be.linear_forward(fv(x), fv(w), fv(y), M, in, out, beta);
    EXPECT_TRUE(same_bits(y, want)) << "forward, beta " << beta;
    // dx = round(dy) round(W) + beta dx
    const Floats dx0 = randn(M * in, 5);
    Floats dx = dx0;
    Floats want_dx = bf16_product(
        M, in, out, [&](int64_t r, int64_t o) { return dyr[r * out + o]; },
        [&](int64_t i, int64_t o) { return wr[o * in + i]; }, false);
    if (beta != 0.0f)
      for (int64_t i = 0; i < M * in; ++i) want_dx[i] = want_dx[i] + beta * dx0[i];
    be.linear_backward_input(fv(dy), fv(w), fv(dx), M, in, out, beta);
    EXPECT_TRUE(same_bits(dx, want_dx)) << "backward input, beta " << beta;
  }
  // dw += round(dy)^T round(x), the product not rounded (a GEMM with beta = 1
  // into the gradient), into fp32 and, rounded once, into bf16 gradients.
  const Floats c = bf16_product(
      out, in, M, [&](int64_t o, int64_t r) { return dyr[r * out + o]; },
      [&](int64_t i, int64_t r) { return xr[r * in + i]; }, false);
  ASSERT_FALSE(same_bits(c, rounded(c)));  // the product is not a bf16 value
  Floats dw = randn(out * in, 6), want_dw = dw;
  for (int64_t i = 0; i < out * in; ++i) want_dw[i] += c[i];
  be.linear_backward_weight(fv(dy), fv(x), fv(dw), M, in, out, 1.0f);
  EXPECT_TRUE(same_bits(dw, want_dw));
  Halves hdw = to_bf16(randn(out * in, 7)), want_h(out * in);
  for (int64_t i = 0; i < out * in; ++i)
    want_h[i] = k::float_to_bf16(k::bf16_to_float(hdw[i]) + c[i]);
  be.linear_backward_weight(fv(dy), fv(x), hv(hdw), M, in, out, 1.0f);
  EXPECT_TRUE(same_bits(hdw, want_h));
  // bf16 weights are the same values as their fp32 originals rounded.
  Halves hw = to_bf16(w);
  Floats y1(M * out), y2(M * out);
  be.linear_forward(fv(x), fv(w), fv(y1), M, in, out, 0.0f);
  be.linear_forward(fv(x), hv(hw), fv(y2), M, in, out, 0.0f);
  EXPECT_TRUE(same_bits(y1, y2));
}

// Random data: sgemm's fp32 sums are no longer exact. The reference sums in
// double from the same rounded inputs. The only difference is the rounding
// of sgemm's fp32 accumulation, at most K * 2^-24 * sum |a b| (K <= 160 here),
// a few 1e-6 of sum |a b|, against bf16's relative spacing of 2^-8 (4e-3): the
// two fp32 sums round to the same bf16 value unless the exact sum lies within
// that sliver of a rounding boundary, and then differ by one bf16 ulp. So: no
// element more than one ulp of its value away, and all but a few equal.
// Random inputs: an fp32 y is sgemm's sum of the rounded inputs (within fp32
// roundoff of the exact one, not rounded to bf16); a bf16 y is that sum rounded
// once, within one bf16 ulp of the exact sum rounded and equal to it almost
// everywhere.
TEST(CpuBackendBf16, LinearRandomMatchesTheReferenceWithinOneUlp) {
  CpuBackend be(DType::kBF16);
  const int64_t M = 33, in = 160, out = 48;
  Floats x = randn(M * in, 1), w = randn(out * in, 2, 0.1f);
  const Floats xr = rounded(x), wr = rounded(w);
  Floats y(M * out), y32(M * out);
  be.linear_forward(fv(x), fv(w), fv(y), M, in, out, 0.0f);
  k::linear_forward(xr.data(), wr.data(), y32.data(), M, in, out, 0.0f);
  EXPECT_TRUE(same_bits(y, y32));
  Halves yb(M * out);
  be.linear_forward(fv(x), fv(w), hv(yb), M, in, out, 0.0f);
  EXPECT_EQ(yb, to_bf16(y));
  const Floats want = bf16_product(
      M, out, in, [&](int64_t r, int64_t i) { return xr[r * in + i]; },
      [&](int64_t c, int64_t i) { return wr[c * in + i]; });
  const Floats got = widened(yb);
  int64_t equal = 0;
  for (int64_t i = 0; i < M * out; ++i) {
    const float ulp = std::ldexp(1.0f, std::ilogb(want[i]) - 7);
    EXPECT_LE(std::fabs(got[i] - want[i]), ulp) << i;
    equal += bits(got[i]) == bits(want[i]);
  }
  EXPECT_GE(equal, M * out * 99 / 100);
  // And it is not the fp32 product of the unrounded inputs: the rounding happened.
  Floats unrounded(M * out);
  k::linear_forward(x.data(), w.data(), unrounded.data(), M, in, out, 0.0f);
  EXPECT_FALSE(same_bits(y, unrounded));
}

TEST(CpuBackendBf16, LinearChecksViews) {
  CpuBackend be(DType::kBF16);
  const int64_t M = 4, in = 8, out = 6;
  Floats x(M * in), w(out * in), y(M * out);
  Ints t(out * in);
  EXPECT_ERROR(be.linear_forward(fv(x), iv(t), fv(y), M, in, out, 0.0f), "linear_forward",
               "w is int32");
  EXPECT_ERROR(be.linear_forward(fv(x), fv(w), fv(y).at(0, M * out - 1), M, in, out, 0.0f),
               "linear_forward", "y holds 23", "needs 24");
  EXPECT_ERROR(be.linear_forward(fv(x), fv(w).at(0, 1), fv(y), M, in, out, 0.0f), "linear_forward",
               "w holds 1");
  EXPECT_ERROR(be.linear_backward_input(fv(y), fv(w), fv(x).at(0, 3), M, in, out, 0.0f),
               "linear_backward_input", "dx holds 3");
  EXPECT_ERROR(be.linear_backward_weight(fv(y), fv(x), iv(t), M, in, out, 1.0f),
               "linear_backward_weight", "dw is int32");
  EXPECT_ERROR(be.linear_backward_weight(fv(y), fv(x).at(0, 5), fv(w), M, in, out, 1.0f),
               "linear_backward_weight", "x holds 5");
  EXPECT_ERROR(be.linear_forward(fv(x), fv(w), fv(y), -1, in, out, 0.0f), "linear_forward",
               "M = -1");
  // Activations fp32 or bf16 (under bf16 compute), nothing else.
  Ints ty(M * out);
  EXPECT_ERROR(be.linear_forward(fv(x), fv(w), iv(ty), M, in, out, 0.0f), "linear_forward",
               "y is int32, expected fp32 or bf16");
}

// ---- bf16 gradients round once per call ---------------------------------------------------------

TEST(CpuBackendBf16, EmbeddingBackwardRoundsOncePerRow) {
  CpuBackend be(DType::kBF16);
  // Token 3 three times: each 2^-9 alone is below half of bf16's spacing at 1
  // (2^-8), so adding and rounding them one by one would leave 1.0; their sum
  // 3 * 2^-9 rounds to 1 + 2^-7.
  const int64_t dim = 2, vocab = 5;
  Ints t = {3, 1, 3, 3};
  const float e = std::ldexp(1.0f, -9);
  Floats dout = {e, -e, 0.5f, 0.25f, e, e, e, 3 * e};
  Halves table(vocab * dim, k::float_to_bf16(1.0f));
  be.embedding_backward(iv(t), fv(dout), hv(table), 4, dim);
  EXPECT_EQ(k::bf16_to_float(table[3 * dim + 0]), 1.0f + std::ldexp(1.0f, -7));
  EXPECT_EQ(k::bf16_to_float(table[3 * dim + 1]), k::round_bf16(1.0f + 3 * e));  // -e + e + 3e
  EXPECT_EQ(k::bf16_to_float(table[1 * dim + 0]), 1.5f);
  EXPECT_EQ(k::bf16_to_float(table[1 * dim + 1]), 1.25f);
  for (int64_t tok : {0, 2, 4})
    for (int64_t j = 0; j < dim; ++j) EXPECT_EQ(k::bf16_to_float(table[tok * dim + j]), 1.0f);
}

TEST(CpuBackendBf16, EmbeddingBackwardMatchesTheReferenceOnAnyThreadCount) {
  CpuBackend be(DType::kF32);
  const int64_t rows = 1000, dim = 33, vocab = 50;
  Floats dout = randn(rows * dim, 1);
  Ints t = random_tokens(rows, vocab, 2);
  const Halves table0 = to_bf16(randn(vocab * dim, 3));
  // Reference: each token's rows summed in fp32 in row order, then one rounding.
  Floats sum(vocab * dim, 0.0f);
  std::vector<bool> seen(vocab, false);
  for (int64_t r = 0; r < rows; ++r) {
    float* s = sum.data() + t[r] * dim;
    for (int64_t j = 0; j < dim; ++j)
      s[j] = seen[t[r]] ? s[j] + dout[r * dim + j] : dout[r * dim + j];
    seen[t[r]] = true;
  }
  Halves want = table0;
  for (int64_t i = 0; i < vocab * dim; ++i)
    if (seen[i / dim]) want[i] = k::float_to_bf16(k::bf16_to_float(table0[i]) + sum[i]);
  const int threads = omp_get_max_threads();
  for (int n : {1, 2, 3}) {
    omp_set_num_threads(n);
    Halves table = table0;
    be.embedding_backward(iv(t), fv(dout), hv(table), rows, dim);
    EXPECT_TRUE(same_bits(table, want)) << n << " threads";
  }
  omp_set_num_threads(threads);
}

TEST(CpuBackendBf16, Bf16GradientsRoundOncePerCall) {
  // rmsnorm_backward and linear_backward_weight into bf16: many rows each
  // adding less than half an ulp still move the gradient.
  CpuBackend be(DType::kF32);
  const int64_t rows = 64, dim = 4;
  Floats x(rows * dim, 1.0f), dy(rows * dim, std::ldexp(1.0f, -10)), inv(rows, 1.0f),
      dx(rows * dim), w(dim, 1.0f);
  Halves dw(dim, k::float_to_bf16(1.0f));
  be.rmsnorm_backward(fv(dy), fv(x), fv(w), fv(inv), fv(dx), hv(dw), rows, dim, {}, 1.0f);
  for (uint16_t h : dw) EXPECT_EQ(k::bf16_to_float(h), 1.0625f);  // 1 + 64 * 2^-10
  Halves lw(dim * dim, k::float_to_bf16(1.0f));
  be.linear_backward_weight(fv(dy), fv(x), hv(lw), rows, dim, dim, 1.0f);
  for (uint16_t h : lw) EXPECT_EQ(k::bf16_to_float(h), 1.0625f);
}

}  // namespace
}  // namespace amsp::backend
