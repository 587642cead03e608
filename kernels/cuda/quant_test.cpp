// The block quantization kernels of kernels/cuda/quant.cu, under the SIMT
// emulation in its three thread orders, against the CPU kernels
// (kernels/cpu/quant.cpp): records, dequantized values and sums must be the
// same bits, padding included, for every shape of unit (one block, two odd
// 4-bit blocks, a block wider than the thread block, one block per chunk), both
// input and output dtypes, and blocks holding NaN and infinities. The CPU
// kernels' own tests (kernels/cpu/quant_test.cpp) hold them to the format and
// the error bound.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "kernels/common/math.h"
#include "kernels/common/quant.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant_test_values.h"
#include "kernels/cuda/emu/simt.h"
#include "kernels/cuda/ops.h"

namespace {

namespace cuda = amsp::kernels::cuda;
namespace cpu = amsp::kernels;
namespace quant = amsp::kernels::quant;
using amsp::emu::simt::Order;
using bf16 = uint16_t;

class CudaQuant : public ::testing::TestWithParam<Order> {
 protected:
  void SetUp() override { amsp::emu::simt::set_order(GetParam()); }
  void TearDown() override { amsp::emu::simt::set_order(Order::kForward); }
};
INSTANTIATE_TEST_SUITE_P(Order, CudaQuant,
                         ::testing::Values(Order::kForward, Order::kReverse, Order::kLowestFirst),
                         [](const ::testing::TestParamInfo<Order>& info) {
                           return info.param == Order::kForward   ? "forward"
                                  : info.param == Order::kReverse ? "reverse"
                                                                  : "lowest_first";
                         });

struct Case {
  int32_t bits;
  int64_t block, n, records;
};

std::string name(const Case& c) {
  return "bits " + std::to_string(c.bits) + " block " + std::to_string(c.block) + " n " +
         std::to_string(c.n) + " records " + std::to_string(c.records);
}

// Elements of a and b whose bits differ.
template <typename T>
int64_t differing(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return -1;
  int64_t d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return d;
}

void check_case(const Case& c, const std::vector<float>& x) {
  const quant::Spec s{c.bits, c.block};
  const std::string what = name(c);
  const int64_t words = c.records * quant::record_words(c.n, s), values = c.records * c.n;
  std::vector<bf16> xh(x.size());
  for (size_t i = 0; i < x.size(); ++i) xh[i] = cpu::float_to_bf16(x[i]);
  for (bool bf16_in : {false, true}) {
    // Unwritten words stay -1 on both sides: the padding must be written.
    std::vector<int32_t> got(words, -1), want(words, -1);
    if (bf16_in) {
      cuda::quantize(xh.data(), c.n, c.records, s, got.data(), nullptr);
      cpu::quantize(xh.data(), c.n, c.records, s, want.data());
    } else {
      cuda::quantize(x.data(), c.n, c.records, s, got.data(), nullptr);
      cpu::quantize(x.data(), c.n, c.records, s, want.data());
    }
    EXPECT_EQ(differing(got, want), 0) << what << (bf16_in ? " bf16" : " fp32") << ": records differ";
  }
  std::vector<int32_t> w(words);
  cpu::quantize(x.data(), c.n, c.records, s, w.data());
  std::vector<float> y(values, -1.0f), want_y(values, -2.0f), sum(c.n, -1.0f), want_sum(c.n, -2.0f);
  std::vector<bf16> yh(values, 1), want_yh(values, 2), sumh(c.n, 1), want_sumh(c.n, 2);
  cuda::dequantize(w.data(), c.n, c.records, s, y.data(), nullptr);
  cpu::dequantize(w.data(), c.n, c.records, s, want_y.data());
  cuda::dequantize(w.data(), c.n, c.records, s, yh.data(), nullptr);
  cpu::dequantize(w.data(), c.n, c.records, s, want_yh.data());
  cuda::dequantize_sum(w.data(), c.n, c.records, s, sum.data(), nullptr);
  cpu::dequantize_sum(w.data(), c.n, c.records, s, want_sum.data());
  cuda::dequantize_sum(w.data(), c.n, c.records, s, sumh.data(), nullptr);
  cpu::dequantize_sum(w.data(), c.n, c.records, s, want_sumh.data());
  EXPECT_EQ(differing(y, want_y), 0) << what << ": dequantize fp32";
  EXPECT_EQ(differing(yh, want_yh), 0) << what << ": dequantize bf16";
  EXPECT_EQ(differing(sum, want_sum), 0) << what << ": dequantize_sum fp32";
  EXPECT_EQ(differing(sumh, want_sumh), 0) << what << ": dequantize_sum bf16";
}

// Units of one block (8 bits, even 4-bit blocks), of two (odd 4-bit blocks),
// blocks of one value, blocks wider than 256 threads, one block per chunk
// (a huge block, and one equal to n), odd n, a single value.
const Case kCases[] = {
    {8, 1, 37, 2},    {4, 1, 37, 2},    {8, 3, 100, 3},   {4, 3, 101, 3},  {4, 4, 99, 2},
    {8, 32, 257, 2},  {4, 33, 257, 3},  {8, 300, 1001, 2}, {4, 301, 1001, 2},
    {8, 1 << 30, 777, 3}, {4, 1 << 30, 777, 3}, {4, 777, 777, 1}, {8, 64, 1, 4}, {4, 64, 1, 4},
};

TEST_P(CudaQuant, SameBitsAsTheCpuKernels) {
  int shift = 0;
  for (const Case& c : kCases) {
    const quant::Spec s{c.bits, c.block};
    check_case(c, amsp::kernels::quant_test::values(c.n, c.records, s, 21, shift++));
  }
}

TEST_P(CudaQuant, NonFiniteBlocksAsOnTheCpu) {
  const float inf = std::numeric_limits<float>::infinity();
  for (const Case& c : {Case{8, 16, 100, 2}, Case{4, 15, 100, 2}}) {
    const quant::Spec s{c.bits, c.block};
    std::vector<float> x = amsp::kernels::quant_test::values(c.n, c.records, s, 22);
    x[3] = std::numeric_limits<float>::quiet_NaN();
    x[40] = inf;
    x[c.n + 99] = -inf;
    check_case(c, x);
  }
}

// An empty chunk or no records launch nothing and write nothing.
TEST_P(CudaQuant, EmptyLaunchesWriteNothing) {
  const quant::Spec s{8, 16};
  std::vector<int32_t> w(4, -7);
  std::vector<float> x(8, 1.0f), y(8, -7.0f);
  cuda::quantize(x.data(), 0, 3, s, w.data(), nullptr);
  cuda::quantize(x.data(), 8, 0, s, w.data(), nullptr);
  cuda::dequantize(w.data(), 8, 0, s, y.data(), nullptr);
  cuda::dequantize_sum(w.data(), 0, 2, s, y.data(), nullptr);
  EXPECT_EQ(w, std::vector<int32_t>(4, -7));
  EXPECT_EQ(y, std::vector<float>(8, -7.0f));
  cuda::dequantize_sum(w.data(), 8, 0, s, y.data(), nullptr);
  EXPECT_EQ(y, std::vector<float>(8, 0.0f));
}

}  // namespace
