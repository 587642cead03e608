// Block quantization through the backends (backend.h): the CPU backend gives
// the CPU kernels' bits, the CUDA backend (on the emulation here) the CPU
// backend's, from fp32 and bf16 views into fp32 and bf16 views, through the
// profiled backend too; and both refuse the same bad calls with the same line.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/profiled_backend.h"
#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant_test_values.h"

namespace amsp::backend {
namespace {

using kernels::quant::Spec;

std::unique_ptr<Backend> make(const std::string& device) {
  return device == "cpu" ? make_cpu_backend(DType::kF32) : make_cuda_backend(DType::kF32, 0);
}

struct Outputs {
  std::vector<int32_t> words;
  std::vector<float> values, sum;
};

// quantize, dequantize and dequantize_sum of x on `be`, with the values in `in`
// and the outputs in `out`.
Outputs run(Backend& be, const std::vector<float>& x, int64_t n, int64_t records, const Spec& s,
            DType in, DType out) {
  const int64_t words = records * kernels::quant::record_words(n, s);
  Buffer v = be.alloc(in, records * n), w = be.alloc(DType::kI32, words);
  Buffer y = be.alloc(out, records * n), sum = be.alloc(out, n);
  be.from_host(x.data(), v.view());
  be.quantize(v.view(), n, records, w.view(), s);
  be.dequantize(w.view(), n, records, y.view(), s);
  be.dequantize_sum(w.view(), n, records, sum.view(), s);
  Outputs o{std::vector<int32_t>(words), std::vector<float>(records * n), std::vector<float>(n)};
  be.to_host(w.view(), o.words.data());
  be.to_host(y.view(), o.values.data());
  be.to_host(sum.view(), o.sum.data());
  return o;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

struct Case {
  int32_t bits;
  int64_t block, n, records;
};
const Case kCases[] = {{8, 32, 257, 3}, {4, 33, 257, 3}, {4, 1 << 20, 1001, 2}, {8, 7, 7, 1}};

TEST(QuantBackend, CpuBackendIsTheCpuKernels) {
  auto be = make_cpu_backend(DType::kF32);
  for (const Case& c : kCases) {
    const Spec s{c.bits, c.block};
    const std::vector<float> x = kernels::quant_test::values(c.n, c.records, s, 31);
    const Outputs o = run(*be, x, c.n, c.records, s, DType::kF32, DType::kF32);
    std::vector<int32_t> w(o.words.size());
    std::vector<float> y(o.values.size()), sum(o.sum.size());
    kernels::quantize(x.data(), c.n, c.records, s, w.data());
    kernels::dequantize(w.data(), c.n, c.records, s, y.data());
    kernels::dequantize_sum(w.data(), c.n, c.records, s, sum.data());
    EXPECT_EQ(o.words, w) << "bits " << c.bits << " block " << c.block;
    EXPECT_TRUE(same_bits(o.values, y)) << "bits " << c.bits << " block " << c.block;
    EXPECT_TRUE(same_bits(o.sum, sum)) << "bits " << c.bits << " block " << c.block;
  }
}

TEST(QuantBackend, CudaBackendGivesTheCpuBackendsBits) {
  auto cpu = make_cpu_backend(DType::kF32);
  auto cuda = make_cuda_backend(DType::kF32, 0);
  ProfiledBackend profiled(make_cuda_backend(DType::kF32, 0));
  for (const Case& c : kCases) {
    for (DType in : {DType::kF32, DType::kBF16}) {
      for (DType out : {DType::kF32, DType::kBF16}) {
        const Spec s{c.bits, c.block};
        const std::string what = "bits " + std::to_string(c.bits) + " block " + std::to_string(c.block) +
                                 " " + dtype_name(in) + " -> " + dtype_name(out);
        const std::vector<float> x = kernels::quant_test::values(c.n, c.records, s, 32);
        const Outputs want = run(*cpu, x, c.n, c.records, s, in, out);
        for (Backend* be : {static_cast<Backend*>(cuda.get()), static_cast<Backend*>(&profiled)}) {
          const Outputs got = run(*be, x, c.n, c.records, s, in, out);
          EXPECT_EQ(got.words, want.words) << what;
          EXPECT_TRUE(same_bits(got.values, want.values)) << what << ": dequantize";
          EXPECT_TRUE(same_bits(got.sum, want.sum)) << what << ": dequantize_sum";
        }
      }
    }
  }
}

TEST(QuantBackend, ProfiledBackendNamesTheCalls) {
  ProfiledBackend be(make_cpu_backend(DType::kF32));
  const Spec s{8, 4};
  const std::vector<float> x(10, 1.0f);
  be.set_timing(true);
  run(be, x, 5, 2, s, DType::kF32, DType::kF32);
  std::vector<std::string> names;
  for (const KernelTime& t : be.take()) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"alloc", "from_host", "quantize", "dequantize", "dequantize_sum",
                                             "to_host"}));
}

// The message of the Error that f throws, or "" if none.
template <typename F>
std::string error_of(const F& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(QuantBackend, BadCallsFailWithOneLineOnEveryBackend) {
  for (const std::string device : {"cpu", "cuda"}) {
    auto be = make(device);
    const Spec s{8, 4};
    Buffer v = be->alloc(DType::kF32, 10), w = be->alloc(DType::kI32, 8), f = be->alloc(DType::kF32, 8);
    Buffer small_w = be->alloc(DType::kI32, 7), h = be->alloc(DType::kF64, 10);
    // 2 records of n = 5 in blocks of 4: 4 words each (8 bytes of scales, 5 of codes, 3 of padding).
    EXPECT_EQ(error_of([&] { be->quantize(v.view(), 5, 2, w.view(), s); }), "") << device;
    const std::pair<std::function<void()>, std::string> cases[] = {
        {[&] { be->quantize(v.view(), 5, 2, w.view(), Spec{3, 4}); }, "quantize: bits = 3, expected 8 or 4"},
        {[&] { be->quantize(v.view(), 5, 2, w.view(), Spec{8, 0}); },
         "quantize: block = 0, expected a positive number of values"},
        {[&] { be->quantize(v.view(), -5, 2, w.view(), s); }, "quantize: n = -5 is negative"},
        {[&] { be->dequantize(w.view(), 5, -1, v.view(), s); }, "dequantize: records = -1 is negative"},
        {[&] { be->quantize(v.view(), 5, 2, f.view(), s); }, "quantize: dst is fp32, expected int32"},
        {[&] { be->quantize(h.view(), 5, 2, w.view(), s); }, "quantize: src is fp64, expected fp32 or bf16"},
        {[&] { be->quantize(v.view(), 5, 2, small_w.view(), s); },
         "quantize: dst holds 7 int32 words, needs 8 (2 records of 4 words: n = 5, bits 8, block 4)"},
        {[&] { be->quantize(v.view(), 6, 2, w.view(), s); }, "quantize: src holds 10 elements, needs 12"},
        {[&] { be->dequantize(small_w.view(), 5, 2, v.view(), s); },
         "dequantize: src holds 7 int32 words, needs 8 (2 records of 4 words: n = 5, bits 8, block 4)"},
        {[&] { be->dequantize_sum(w.view(), 11, 0, v.view(), s); }, "dequantize_sum: dst holds 10 elements, needs 11"},
        {[&] { be->dequantize_sum(v.view(), 5, 2, v.view(), s); }, "dequantize_sum: src is fp32, expected int32"},
    };
    for (const auto& [call, message] : cases) EXPECT_EQ(error_of(call), message) << device;
  }
  // The CUDA backend reads device memory only.
  auto cuda = make_cuda_backend(DType::kF32, 0);
  std::vector<float> host(10);
  Buffer w = cuda->alloc(DType::kI32, 8);
  EXPECT_EQ(error_of([&] { cuda->quantize(host_view(host.data(), 10), 5, 2, w.view(), Spec{8, 4}); }),
            "quantize: src is cpu memory; the cuda backend reads device memory only");
}

}  // namespace
}  // namespace amsp::backend
