// Block quantization on the CPU (kernels/cpu/quant.cpp) beside a plain copy of
// the same bytes: 64 Mi fp32 values (256 MiB), the size of a large gradient
// bucket. bytes/s counts the fp32 values' bytes in every benchmark, so the
// figures compare directly (doc/compression.md quotes a run).
//
//   build/benchmarks/quant_bench --benchmark_counters_tabular=true

#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "core/rng.h"
#include "kernels/common/quant.h"
#include "kernels/cpu/ops.h"

namespace {

using namespace amsp;
using kernels::quant::Spec;

constexpr int64_t kValues = int64_t{64} << 20;

const std::vector<float>& values() {
  static const std::vector<float> v = [] {
    std::vector<float> x(static_cast<size_t>(kValues));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < kValues; ++i) x[static_cast<size_t>(i)] = static_cast<float>(random_normal(5, 0, i));
    return x;
  }();
  return v;
}

void set_bytes(benchmark::State& state) { state.SetBytesProcessed(state.iterations() * kValues * 4); }

Spec spec_of(const benchmark::State& state) {
  return Spec{static_cast<int32_t>(state.range(0)), state.range(1)};
}

void BM_Copy(benchmark::State& state) {
  const std::vector<float>& x = values();
  std::vector<float> y(x.size());
  for (auto _ : state) {
    std::memcpy(y.data(), x.data(), x.size() * sizeof(float));
    benchmark::ClobberMemory();
  }
  set_bytes(state);
}
BENCHMARK(BM_Copy)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Quantize(benchmark::State& state) {
  const Spec s = spec_of(state);
  const std::vector<float>& x = values();
  std::vector<int32_t> w(static_cast<size_t>(kernels::quant::record_words(kValues, s)));
  for (auto _ : state) kernels::quantize(x.data(), kValues, 1, s, w.data());
  set_bytes(state);
}

void BM_Dequantize(benchmark::State& state) {
  const Spec s = spec_of(state);
  const std::vector<float>& x = values();
  std::vector<int32_t> w(static_cast<size_t>(kernels::quant::record_words(kValues, s)));
  kernels::quantize(x.data(), kValues, 1, s, w.data());
  std::vector<float> y(x.size());
  for (auto _ : state) kernels::dequantize(w.data(), kValues, 1, s, y.data());
  set_bytes(state);
}

void BM_QuantizeDequantize(benchmark::State& state) {
  const Spec s = spec_of(state);
  const std::vector<float>& x = values();
  std::vector<int32_t> w(static_cast<size_t>(kernels::quant::record_words(kValues, s)));
  std::vector<float> y(x.size());
  for (auto _ : state) {
    kernels::quantize(x.data(), kValues, 1, s, w.data());
    kernels::dequantize(w.data(), kValues, 1, s, y.data());
  }
  set_bytes(state);
}

// int8 and int4 in blocks of 256 and 2048 values, and one scale for all 64 Mi.
void Specs(benchmark::internal::Benchmark* b) {
  for (int64_t bits : {8, 4})
    for (int64_t block : {int64_t{256}, int64_t{2048}, kValues}) b->Args({bits, block});
  b->ArgNames({"bits", "block"})->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK(BM_Quantize)->Apply(Specs);
BENCHMARK(BM_Dequantize)->Apply(Specs);
BENCHMARK(BM_QuantizeDequantize)->Apply(Specs);

}  // namespace

BENCHMARK_MAIN();
