// Block quantization on the CPU (kernels/cpu/quant.cpp) against what
// doc/compression.md promises: record sizes, the bytes of hand-made records,
// ties to even, the error bound on awkward inputs, non-finite values, the sum's
// order and roundings, and the same bits with any thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/common/math.h"
#include "kernels/common/quant.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant_test_values.h"

namespace amsp::kernels {
namespace {

using quant::Spec;

std::vector<int32_t> quantized(const std::vector<float>& x, int64_t n, int64_t records, const Spec& s) {
  std::vector<int32_t> w(static_cast<size_t>(records * quant::record_words(n, s)), -1);
  quantize(x.data(), n, records, s, w.data());
  return w;
}

std::vector<float> dequantized(const std::vector<int32_t>& w, int64_t n, int64_t records, const Spec& s) {
  std::vector<float> y(static_cast<size_t>(records * n));
  dequantize(w.data(), n, records, s, y.data());
  return y;
}

// The bytes of words [from, end).
std::vector<uint8_t> bytes_of(const std::vector<int32_t>& w, size_t from) {
  std::vector<uint8_t> b((w.size() - from) * 4);
  std::memcpy(b.data(), w.data() + from, b.size());
  return b;
}

uint32_t bits(float f) { return float_to_bits(f); }

std::string name(const Spec& s, int64_t n, int64_t records) {
  return "bits " + std::to_string(s.bits) + " block " + std::to_string(s.block) + " n " +
         std::to_string(n) + " records " + std::to_string(records);
}

TEST(QuantFormat, RecordSizes) {
  constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();
  struct Case {
    int32_t bits;
    int64_t block, n, blocks, bytes;
  };
  const Case cases[] = {
      {8, 4, 5, 2, 16},             // 8 + 5 = 13 -> 16
      {4, 4, 5, 2, 12},             // 8 + 3 = 11 -> 12
      {4, 3, 7, 3, 16},             // 12 + 4
      {8, 2048, 0, 0, 0},           // an empty chunk is an empty record
      {8, 2048, 1, 1, 8},           // 4 + 1 -> 8
      {4, 2048, 1, 1, 8},           // 4 + 1 -> 8
      {8, kHuge, 1000, 1, 1004},    // one scale per chunk
      {4, kHuge, 1001, 1, 508},     // 4 + 501 -> 508
      {8, 1, 3, 3, 16},             // 12 + 3 -> 16
      {4, 256, 1 << 20, 4096, 16384 + (1 << 19)},
  };
  for (const Case& c : cases) {
    const Spec s{c.bits, c.block};
    EXPECT_TRUE(quant::valid(s));
    EXPECT_EQ(quant::blocks(c.n, s), c.blocks) << name(s, c.n, 1);
    EXPECT_EQ(quant::record_bytes(c.n, s), c.bytes) << name(s, c.n, 1);
    EXPECT_EQ(quant::record_words(c.n, s) * 4, c.bytes) << name(s, c.n, 1);
    EXPECT_EQ(quant::codes_offset(c.n, s), 4 * c.blocks) << name(s, c.n, 1);
  }
  EXPECT_FALSE(quant::valid(Spec{2, 16}));
  EXPECT_FALSE(quant::valid(Spec{8, 0}));
  EXPECT_EQ(quant::qmax(Spec{8, 1}), 127);
  EXPECT_EQ(quant::qmax(Spec{4, 1}), 7);
}

// Records whose every byte is known: amax = qmax makes inv and scale 1.
TEST(QuantFormat, HandMadeRecordsHoldTheDocumentedBytes) {
  {
    // 4 bits, one block of 7: codes 7 -7 2 -2 4 0 1 (2.5 -> 2 and 3.5 -> 4: ties to even),
    // low nibble first, two's complement; the odd last nibble is 0. 4 + 4 bytes, no padding.
    const std::vector<float> x = {7.0f, -7.0f, 2.5f, -2.5f, 3.5f, 0.0f, 1.0f};
    const Spec s{4, 7};
    const std::vector<int32_t> w = quantized(x, 7, 1, s);
    ASSERT_EQ(w.size(), 2u);
    EXPECT_EQ(static_cast<uint32_t>(w[0]), bits(1.0f));
    const std::vector<uint8_t> want = {0x97, 0xe2, 0x04, 0x01};
    EXPECT_EQ(bytes_of(w, 1), want);
    EXPECT_EQ(dequantized(w, 7, 1, s), (std::vector<float>{7, -7, 2, -2, 4, 0, 1}));
  }
  {
    // 8 bits, blocks of 4: {127, -1.5, 0.5, -127} (inv 1) and {2, 1} (inv 63.5: 1 * 63.5
    // is a tie, to 64); scales 1 and 2/127, codes, two zero bytes of padding.
    const std::vector<float> x = {127.0f, -1.5f, 0.5f, -127.0f, 2.0f, 1.0f};
    const Spec s{8, 4};
    const std::vector<int32_t> w = quantized(x, 6, 1, s);
    ASSERT_EQ(w.size(), 4u);
    EXPECT_EQ(static_cast<uint32_t>(w[0]), bits(1.0f));
    EXPECT_EQ(static_cast<uint32_t>(w[1]), bits(2.0f / 127.0f));
    const std::vector<uint8_t> want = {0x7f, 0xfe, 0x00, 0x81, 0x7f, 0x40, 0x00, 0x00};
    EXPECT_EQ(bytes_of(w, 2), want);
    const float s1 = 2.0f / 127.0f;
    EXPECT_EQ(dequantized(w, 6, 1, s), (std::vector<float>{127, -2, 0, -127, 127 * s1, 64 * s1}));
  }
}

TEST(Quant, TiesRoundToEven) {
  for (int32_t b : {8, 4}) {
    const Spec s{b, 1 << 20};  // one block: amax = qmax makes inv 1
    const float q = static_cast<float>(quant::qmax(s));
    std::vector<float> x, want;
    for (float k = 0.5f; k < q; k += 1.0f) {
      x.push_back(k);
      x.push_back(-k);
      const float even = std::fmod(k - 0.5f, 2.0f) == 0.0f ? k - 0.5f : k + 0.5f;
      want.push_back(even);
      want.push_back(-even);
    }
    x.push_back(q);
    want.push_back(q);
    const int64_t n = static_cast<int64_t>(x.size());
    EXPECT_EQ(dequantized(quantized(x, n, 1, s), n, 1, s), want) << "bits " << b;
  }
}

// Every value within the bound of its block (quant_test_values.h), dequantized
// to fp32 and to bf16, from fp32 and from bf16 inputs; the scales as stated;
// and the bound nearly reached, so it says something.
TEST(Quant, ErrorBoundOnAwkwardValues) {
  double worst_ratio = 0;  // |x - y| / (amax / (2 qmax)) over normal blocks
  int64_t checked = 0;
  for (int32_t b : {8, 4}) {
    for (int64_t block : {1, 3, 32, 33, 256, 1000}) {
      for (int64_t n : {1, 7, 100, 257, 999}) {
        for (int64_t records : {1, 3}) {
          for (bool bf16_in : {false, true}) {
            const Spec s{b, block};
            const std::string what = name(s, n, records) + (bf16_in ? " bf16 in" : "");
            std::vector<float> x = quant_test::values(n, records, s, 11, static_cast<int>(block + n));
            std::vector<uint16_t> xh(x.size());
            for (size_t i = 0; i < x.size(); ++i) xh[i] = float_to_bf16(x[i]);
            if (bf16_in)
              for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_float(xh[i]);
            std::vector<int32_t> w(static_cast<size_t>(records * quant::record_words(n, s)), -1);
            if (bf16_in)
              quantize(xh.data(), n, records, s, w.data());
            else
              quantize(x.data(), n, records, s, w.data());
            EXPECT_EQ(w, quantized(x, n, records, s)) << what << ": bf16 input not its fp32 value";
            const std::vector<float> y = dequantized(w, n, records, s);
            std::vector<uint16_t> yh(y.size());
            dequantize(w.data(), n, records, s, yh.data());
            for (int64_t r = 0; r < records; ++r) {
              for (int64_t k = 0; k < quant::blocks(n, s); ++k) {
                const int64_t lo = k * block, hi = std::min(n, lo + block);
                float amax = 0;
                for (int64_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(x[r * n + i]));
                const float scale = quant::scale_at(w.data() + r * quant::record_words(n, s), k);
                const float want_scale = amax / static_cast<float>(quant::qmax(s));
                ASSERT_EQ(bits(scale), bits(want_scale)) << what << " record " << r << " block " << k;
                const double bound = quant_test::error_bound(amax, s);
                const int kind = quant_test::kind_of(r, k, n, s, static_cast<int>(block + n));
                for (int64_t i = r * n + lo; i < r * n + hi; ++i) {
                  const double err = std::fabs(double{x[i]} - y[i]);
                  ASSERT_LE(err, bound) << what << " value " << i << " (" << quant_test::kind_name(kind)
                                        << "): x " << x[i] << " y " << y[i] << " amax " << amax;
                  const double yb = bf16_to_float(yh[i]);
                  ASSERT_EQ(yh[i], float_to_bf16(y[i])) << what << " value " << i;
                  ASSERT_LE(std::fabs(double{x[i]} - yb), bound + 0x1p-8 * std::fabs(yb) + 0x1p-134)
                      << what << " value " << i << " in bf16";
                  if (kind == quant_test::kNormal && amax > 0)
                    worst_ratio = std::max(worst_ratio, err / (amax / (2.0 * quant::qmax(s))));
                  ++checked;
                }
              }
            }
          }
        }
      }
    }
  }
  std::printf("  %lld values within the bound; worst error %.4f of half a step (normal blocks)\n",
              static_cast<long long>(checked), worst_ratio);
  EXPECT_GT(worst_ratio, 0.95);
  EXPECT_LE(worst_ratio, 1.001);
}

// Below amax = 2^-64 x and amax are taken up by 2^64 first; where qmax / amax is
// still finite that must give the plain formula's codes (quant.h's claim).
TEST(Quant, TinyBlocksGiveThePlainFormulasCodes) {
  for (int32_t b : {8, 4}) {
    const Spec s{b, 50};
    const float q = static_cast<float>(quant::qmax(s));
    for (float unit : {1e-21f, 1e-30f, 1e-35f}) {
      std::vector<float> x(50);
      for (int64_t i = 0; i < 50; ++i) x[i] = unit * static_cast<float>(random_normal(3, 0, i));
      float amax = 0;
      for (float v : x) amax = std::max(amax, std::fabs(v));
      ASSERT_LT(amax, 0x1p-64f);
      const float inv = q / amax;
      ASSERT_TRUE(std::isfinite(inv));
      const std::vector<float> y = dequantized(quantized(x, 50, 1, s), 50, 1, s);
      for (int64_t i = 0; i < 50; ++i) {
        const float plain = std::min(q, std::max(-q, std::rint(x[i] * inv)));
        EXPECT_EQ(y[i], plain * (amax / q)) << "bits " << b << " unit " << unit << " value " << i;
      }
    }
  }
}

// A NaN or an infinity makes its block's scale NaN and its codes 0: every value of
// that block comes back NaN, through dequantize and dequantize_sum, in fp32 and
// bf16; the other blocks are untouched.
TEST(Quant, NonFiniteValuesPoisonTheirBlockOnly) {
  const float inf = std::numeric_limits<float>::infinity();
  for (int32_t b : {8, 4}) {
    const Spec s{b, 5};
    const int64_t n = 23;  // 5 blocks, the last of 3
    std::vector<float> x = quant_test::values(n, 1, s, 5);
    for (float& v : x) v = std::isfinite(v) ? v : 1.0f;
    x[7] = std::numeric_limits<float>::quiet_NaN();
    x[14] = inf;
    x[22] = -inf;
    const std::vector<int32_t> w = quantized(x, n, 1, s);
    const std::vector<float> y = dequantized(w, n, 1, s);
    std::vector<float> sum(n);
    std::vector<int32_t> two = w;
    two.insert(two.end(), w.begin(), w.end());
    dequantize_sum(two.data(), n, 2, s, sum.data());
    std::vector<uint16_t> yh(n);
    dequantize(w.data(), n, 1, s, yh.data());
    for (int64_t k = 0; k < 5; ++k) {
      const bool poisoned = k == 1 || k == 2 || k == 4;
      EXPECT_EQ(static_cast<uint32_t>(w[k]) == quant::kNanScaleBits, poisoned) << "block " << k;
      for (int64_t i = k * 5; i < std::min(n, k * 5 + 5); ++i) {
        EXPECT_EQ(std::isnan(y[i]), poisoned) << "bits " << b << " value " << i;
        EXPECT_EQ(std::isnan(sum[i]), poisoned) << "bits " << b << " value " << i;
        EXPECT_EQ(std::isnan(bf16_to_float(yh[i])), poisoned) << "bits " << b << " value " << i;
        if (poisoned) EXPECT_EQ(quant::code_at(reinterpret_cast<const uint8_t*>(w.data() + 5), i, s), 0);
      }
    }
  }
}

// The top of the fp32 range: just below FLT_MAX the bound holds; at FLT_MAX
// itself 127 * fl(FLT_MAX / 127) rounds past FLT_MAX, so 8-bit codes of
// +-127 come back infinite (doc/compression.md); 4 bits stay finite.
TEST(Quant, TopOfTheRange) {
  const float top = std::numeric_limits<float>::max();
  for (int32_t b : {8, 4}) {
    const Spec s{b, 2};
    const std::vector<float> x = {std::nextafter(top, 0.0f), -1.0f, top, 1.0f};
    const std::vector<float> y = dequantized(quantized(x, 4, 1, s), 4, 1, s);
    EXPECT_LE(std::fabs(double{x[0]} - y[0]), quant_test::error_bound(x[0], s));
    EXPECT_EQ(y[2], b == 8 ? std::numeric_limits<float>::infinity() : top) << "bits " << b;
  }
}

// q * scale in fp32, then each addition in fp32: in double the product is exact
// and a double sum of two floats rounds to the float sum (53 >= 2 * 24 + 2), so
// no contraction of this test's code can change these reference values.
std::vector<float> reference_sum(const std::vector<int32_t>& w, int64_t n, int64_t records, const Spec& s) {
  std::vector<float> acc(static_cast<size_t>(n), 0.0f);
  const int64_t rw = quant::record_words(n, s);
  for (int64_t r = 0; r < records; ++r) {
    const int32_t* rec = w.data() + r * rw;
    const auto* codes = reinterpret_cast<const uint8_t*>(rec) + quant::codes_offset(n, s);
    for (int64_t i = 0; i < n; ++i) {
      const float p = static_cast<float>(double{static_cast<float>(quant::code_at(codes, i, s))} *
                                         double{quant::scale_at(rec, i / s.block)});
      acc[i] = r == 0 ? p : static_cast<float>(double{acc[i]} + double{p});
    }
  }
  return acc;
}

TEST(Quant, DequantizeSumRoundsEveryProductAndAddition) {
  for (int32_t b : {8, 4}) {
    const Spec s{b, 100};
    const int64_t n = 10000, records = 5;
    std::vector<float> x(static_cast<size_t>(n * records));
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(random_normal(9, b, i));
    const std::vector<int32_t> w = quantized(x, n, records, s);
    const std::vector<float> want = reference_sum(w, n, records, s);
    // The inputs must tell a fused multiply-add from two roundings, or this test
    // could not fail when one creeps in.
    int64_t fma_differs = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t rw = quant::record_words(n, s);
      float acc = 0;
      for (int64_t r = 0; r < records; ++r) {
        const int32_t* rec = w.data() + r * rw;
        const auto* codes = reinterpret_cast<const uint8_t*>(rec) + quant::codes_offset(n, s);
        const float q = static_cast<float>(quant::code_at(codes, i, s)), sc = quant::scale_at(rec, i / s.block);
        acc = r == 0 ? q * sc : std::fma(q, sc, acc);
      }
      fma_differs += acc != want[i];
    }
    EXPECT_GT(fma_differs, n / 100) << "bits " << b;
    std::vector<float> got(n);
    dequantize_sum(w.data(), n, records, s, got.data());
    int64_t differ = 0;
    for (int64_t i = 0; i < n; ++i) differ += bits(got[i]) != bits(want[i]);
    EXPECT_EQ(differ, 0) << "bits " << b << ": values not the sum of rounded products, in order";
    std::vector<uint16_t> got_h(n);
    dequantize_sum(w.data(), n, records, s, got_h.data());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got_h[i], float_to_bf16(want[i])) << "bits " << b << " value " << i;
  }
}

TEST(Quant, OneRecordSumsToItsValuesAndNoneToZero) {
  const Spec s{4, 33};
  const int64_t n = 301;
  const std::vector<float> x = quant_test::values(n, 1, s, 4);
  const std::vector<int32_t> w = quantized(x, n, 1, s);
  std::vector<float> sum(n, -1.0f);
  dequantize_sum(w.data(), n, 1, s, sum.data());
  EXPECT_EQ(sum, dequantized(w, n, 1, s));
  dequantize_sum(w.data(), n, 0, s, sum.data());
  for (float v : sum) ASSERT_EQ(bits(v), 0u);
}

TEST(Quant, EmptyChunksWriteNothing) {
  const Spec s{8, 16};
  std::vector<int32_t> w(4, -7);
  std::vector<float> x(8, 1.0f), y(8, -7.0f);
  quantize(x.data(), 0, 3, s, w.data());
  quantize(x.data(), 8, 0, s, w.data());
  dequantize(w.data(), 8, 0, s, y.data());
  dequantize_sum(w.data(), 0, 2, s, y.data());
  EXPECT_EQ(w, std::vector<int32_t>(4, -7));
  EXPECT_EQ(y, std::vector<float>(8, -7.0f));
}

// Blocks over the threads, or one block's values over them (a chunk per tensor):
// the same bits with 1, 2 and 3 threads.
TEST(Quant, SameBitsWithAnyThreadCount) {
  const int threads = omp_get_max_threads();
  struct Case {
    int32_t bits;
    int64_t block, n, records;
  };
  for (const Case& c : {Case{8, 32, 10000, 3}, Case{4, 31, 10001, 2}, Case{8, 1 << 30, 100001, 1},
                        Case{4, 1 << 30, 100001, 1}}) {
    const Spec s{c.bits, c.block};
    const std::vector<float> x = quant_test::values(c.n, c.records, s, 8);
    std::vector<int32_t> want_w;
    std::vector<float> want_y, want_sum;
    for (int t : {1, 2, 3}) {
      omp_set_num_threads(t);
      const std::vector<int32_t> w = quantized(x, c.n, c.records, s);
      const std::vector<float> y = dequantized(w, c.n, c.records, s);
      std::vector<float> sum(c.n);
      dequantize_sum(w.data(), c.n, c.records, s, sum.data());
      if (t == 1) {
        want_w = w, want_y = y, want_sum = sum;
        continue;
      }
      EXPECT_EQ(w, want_w) << name(s, c.n, c.records) << ", " << t << " threads";
      EXPECT_EQ(std::memcmp(y.data(), want_y.data(), y.size() * 4), 0) << name(s, c.n, c.records);
      EXPECT_EQ(std::memcmp(sum.data(), want_sum.data(), sum.size() * 4), 0) << name(s, c.n, c.records);
    }
  }
  omp_set_num_threads(threads);
}

}  // namespace
}  // namespace amsp::kernels
