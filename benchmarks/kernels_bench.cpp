// Kernel and full-step benchmarks (Google Benchmark). The first benchmark is
// OpenBLAS's large-sgemm peak on this machine, measured in the same run, so
// every GFLOP/s figure below it can be read against it.
//
//   build/benchmarks/kernels_bench --benchmark_counters_tabular=true

#include <benchmark/benchmark.h>
#include <cblas.h>

#include <vector>

#include "backend/backend.h"
#include "core/rng.h"
#include "engine/optimizer.h"
#include "kernels/cpu/ops.h"
#include "model/config.h"
#include "model/llama.h"

namespace {

using namespace amsp;

std::vector<float> random_vector(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(random_normal(seed, 0, i));
  return v;
}

void set_flops(benchmark::State& state, double flops_per_iter) {
  state.counters["GFLOP/s"] = benchmark::Counter(flops_per_iter * state.iterations() / 1e9,
                                                 benchmark::Counter::kIsRate);
}

// The reference: the best this BLAS does on a large square fp32 product.
void BM_SgemmPeak(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  auto a = random_vector(static_cast<size_t>(n) * n, 1), b = random_vector(a.size(), 2);
  std::vector<float> c(a.size());
  for (auto _ : state)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
  set_flops(state, 2.0 * n * n * static_cast<double>(n));
}
BENCHMARK(BM_SgemmPeak)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();

// A model-shaped projection: [B*T, in] x [out, in]^T.
void BM_LinearForward(benchmark::State& state) {
  const int64_t M = state.range(0), in = state.range(1), out = state.range(2);
  auto x = random_vector(M * in, 1), w = random_vector(out * in, 2);
  std::vector<float> y(M * out);
  for (auto _ : state) kernels::linear_forward(x.data(), w.data(), y.data(), M, in, out);
  set_flops(state, 2.0 * M * in * out);
}
BENCHMARK(BM_LinearForward)->Args({2048, 384, 1024})->Args({2048, 768, 2048})
    ->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Attention(benchmark::State& state) {
  const int64_t B = 8, T = state.range(0), H = state.range(1), KV = state.range(2), D = 64;
  auto q = random_vector(B * T * H * D, 1), k = random_vector(B * T * KV * D, 2),
       v = random_vector(B * T * KV * D, 3), dout = random_vector(B * T * H * D, 4);
  std::vector<float> probs(B * H * T * T), out(B * T * H * D), dq(q.size()), dk(k.size()), dv(v.size());
  for (auto _ : state) {
    kernels::attention_forward(q.data(), k.data(), v.data(), H * D, KV * D, probs.data(),
                               out.data(), B, T, H, KV, D);
    kernels::attention_backward(q.data(), k.data(), v.data(), H * D, KV * D, {}, probs.data(),
                                dout.data(), dq.data(), dk.data(), dv.data(), B, T, H, KV, D);
  }
  // Forward 2 products, backward 4, each 2*T*T*D per head (full square, as computed).
  set_flops(state, 6.0 * 2.0 * B * H * T * T * D);
}
BENCHMARK(BM_Attention)->Args({256, 6, 6})->Args({256, 12, 4})->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_RmsNorm(benchmark::State& state) {
  const int64_t rows = 2048, dim = state.range(0);
  auto x = random_vector(rows * dim, 1), w = random_vector(dim, 2), dy = random_vector(rows * dim, 3);
  std::vector<float> y(rows * dim), inv(rows), dx(rows * dim), dw(dim);
  for (auto _ : state) {
    kernels::rmsnorm_forward(x.data(), w.data(), y.data(), inv.data(), rows, dim, 1e-5f);
    kernels::rmsnorm_backward(dy.data(), x.data(), w.data(), inv.data(), dx.data(), dw.data(), rows, dim);
  }
  state.SetBytesProcessed(state.iterations() * rows * dim * 4 * 5);
}
BENCHMARK(BM_RmsNorm)->Arg(768)->Unit(benchmark::kMicrosecond)->UseRealTime();

// One full optimizer step (forward, backward, AdamW) of a preset on random
// tokens: batch x 256 tokens.
void BM_TrainStep(benchmark::State& state, const char* preset, int64_t batch) {
  const model::LlamaConfig config = model::load_config(preset);
  const int64_t T = 256;
  const auto be = backend::make_cpu_backend(DType::kF32);
  model::Llama llama(config, *be, batch, T);
  const auto& units = llama.units();
  std::vector<std::vector<float>> p, g, m, v;
  for (size_t u = 0; u < units.size(); ++u) {
    p.emplace_back(units[u].numel);
    model::init_unit_params(units[u], static_cast<int>(u), 1, p.back().data());
    g.emplace_back(units[u].numel, 0.0f);
    m.emplace_back(units[u].numel, 0.0f);
    v.emplace_back(units[u].numel, 0.0f);
  }
  std::vector<int32_t> tokens(batch * T), targets(batch * T);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>(random_below(3, 0, i, config.vocab_size));
    targets[i] = static_cast<int32_t>(random_below(4, 0, i, config.vocab_size));
  }
  const engine::AdamWOptions adamw;
  float no_clipping = 1.0f;  // the gradient's scale
  int64_t step = 0;
  for (auto _ : state) {
    llama.set_batch(tokens.data(), targets.data(), batch, T, 1.0f / (batch * T));
    for (int u = 0; u < llama.num_units(); ++u) llama.forward(u, backend::host_view(p[u].data(), units[u].numel));
    for (int u = llama.num_units() - 1; u >= 0; --u)
      llama.backward(u, backend::host_view(p[u].data(), units[u].numel),
                     backend::host_view(g[u].data(), units[u].numel), model::Llama::Grads::kAdd);
    ++step;
    for (size_t u = 0; u < units.size(); ++u)
      engine::adamw_update_range(*be, units[u],
                                 {0, units[u].numel, backend::host_view(p[u].data(), units[u].numel),
                                  backend::host_view(g[u].data(), units[u].numel),
                                  backend::host_view(m[u].data(), units[u].numel),
                                  backend::host_view(v[u].data(), units[u].numel), {}},
                                 adamw, 1e-4, step, backend::host_view(&no_clipping, 1));
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(batch * T) * state.iterations(),
                                                  benchmark::Counter::kIsRate);
  set_flops(state, model::Llama::flops_per_token(config, T) * batch * T);
}
BENCHMARK_CAPTURE(BM_TrainStep, small, "small", 8)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);
BENCHMARK_CAPTURE(BM_TrainStep, base, "base", 4)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(5.0);

}  // namespace

BENCHMARK_MAIN();
