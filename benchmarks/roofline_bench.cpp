// The CUDA backend's training step, counted and set against a roofline: a
// model of its speed on an H100, made where no GPU runs.
//
// One optimizer step of one rank (one micro-batch of --seq-len tokens, the
// forward and backward of every unit, the gradient norm, AdamW) runs on the
// CUDA backend under the emulation, wrapped in the counting ProfiledBackend
// (backend/profiled_backend.h). Per backend call, by name: stream operations,
// device bytes moved beside the call's minimum (operands read once, results
// written once), and FLOPs on tensor cores and on CUDA cores, as the emulation
// counts them (kernels/cuda/emu/runtime.h, device_counts). Each row gets a
// roofline time on an H100 SXM, the larger of its bytes at 3.35 TB/s and its
// FLOPs at 989 TFLOP/s (bf16, tensor cores) plus 67 TFLOP/s (fp32, CUDA cores).
//
// The model runs one decoder layer (--model's sizes) and scales its rows by the
// model's layer count: every layer runs the same calls. By default a dry run:
// kernels and cuBLAS are checked and counted but not executed (counts depend
// on shapes, not values; roofline_bench_sample checks that a dry and an
// executed step count the same), so llama-7b's sizes take seconds.
//
// This is a model, not a measurement: it knows nothing of latency, occupancy,
// L2 reuse or overlap, and it cannot see re-reads inside a kernel. What it
// shows is where the step's bytes and FLOPs go and how far each call is from
// the least it must move. doc/gpu.md, "Counted here", reads its output.
//
//   build/benchmarks/roofline_bench [--model llama-1b] [--seq-len 2048]
//                                   [--precision bf16|fp32] [--execute]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/profiled_backend.h"
#include "core/error.h"
#include "engine/optimizer.h"
#include "kernels/cuda/api.h"
#include "model/config.h"
#include "model/llama.h"

namespace {

using namespace amsp;
using backend::Buffer;
using amsp::DType;
using backend::KernelTime;

// The H100 SXM of the model.
constexpr double kBandwidth = 3.35e12, kTensorPeak = 989e12, kSimtPeak = 67e12;
// A call moving more than this times its minimum bytes misses the goal.
constexpr double kBytesGoal = 1.25;

struct Options {
  std::string model = "llama-1b";
  int64_t seq_len = 2048;
  DType precision = DType::kBF16;
  bool execute = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--model" && has_value) {
      o.model = argv[++i];
    } else if (a == "--seq-len" && has_value) {
      o.seq_len = std::atoll(argv[++i]);
    } else if (a == "--precision" && has_value) {
      const std::string p = argv[++i];
      if (p != "bf16" && p != "fp32") fail_usage("--precision ", p, ": expected bf16 or fp32");
      o.precision = p == "bf16" ? DType::kBF16 : DType::kF32;
    } else if (a == "--execute") {
      o.execute = true;
    } else {
      fail_usage("roofline_bench: unknown argument ", a,
                 "; expected --model NAME, --seq-len N, --precision bf16|fp32, --execute");
    }
  }
  if (o.seq_len < 1) fail_usage("--seq-len must be >= 1");
  return o;
}

// One row of the table: a call's name and what it asked of the device, summed
// over the step, with how many times the whole model repeats it.
struct Row {
  KernelTime k;
  int64_t repeat = 1;
};

double flops(const KernelTime& k) { return k.tensor_flops + k.simt_flops; }
double compute_s(const KernelTime& k) { return k.tensor_flops / kTensorPeak + k.simt_flops / kSimtPeak; }
double roofline_s(const KernelTime& k) {
  return std::max(static_cast<double>(k.bytes) / kBandwidth, compute_s(k));
}
bool memory_bound(const KernelTime& k) { return static_cast<double>(k.bytes) / kBandwidth >= compute_s(k); }

// Adds b's counts into a (same name).
void add_into(KernelTime& a, const KernelTime& b) {
  a.calls += b.calls;
  a.launches += b.launches;
  a.host_syncs += b.host_syncs;
  a.bytes += b.bytes;
  a.min_bytes += b.min_bytes;
  a.tensor_flops += b.tensor_flops;
  a.simt_flops += b.simt_flops;
}

// The calls since the last take, into rows keyed by (repeat, name).
void collect(backend::ProfiledBackend& be, int64_t repeat, std::map<std::pair<int64_t, std::string>, Row>& rows) {
  for (const KernelTime& k : be.take()) {
    Row& r = rows[{repeat, k.name}];
    if (r.k.name.empty()) {
      r.k.name = k.name;
      r.k.op = k.op;
      r.repeat = repeat;
    }
    add_into(r.k, k);
  }
}

// One unit's parameters, gradient and optimizer state.
struct UnitState {
  Buffer params, grad, master, m, v;
};

UnitState unit_state(backend::Backend& be, const model::UnitSpec& u, DType precision) {
  return {be.alloc(precision, u.numel), be.alloc(DType::kF32, u.numel), be.alloc(DType::kF32, u.numel),
          be.alloc(DType::kF32, u.numel), be.alloc(DType::kF32, u.numel)};
}

// One step: forward, backward, norm, AdamW; the rows of the decoder layer
// repeat `layers` times in the whole model.
std::vector<Row> count_step(const Options& o, const model::LlamaConfig& one_layer, int64_t layers) {
  backend::ProfiledBackend be(backend::make_cuda_backend(o.precision, 0));
  model::Llama model(one_layer, be, 1, o.seq_len);
  const std::vector<model::UnitSpec>& units = model.units();
  std::vector<UnitState> st;
  for (const model::UnitSpec& u : units) st.push_back(unit_state(be, u, o.precision));
  Buffer acc = be.alloc(DType::kF64, 4), sumsq = be.alloc(DType::kF64, 1), scale = be.alloc(DType::kF32, 1);
  Buffer pinned = be.alloc_host(2 * o.seq_len);
  std::memset(pinned.data(), 0, static_cast<size_t>(2 * o.seq_len) * sizeof(int32_t));
  const int32_t* ids = static_cast<const int32_t*>(pinned.data());

  std::map<std::pair<int64_t, std::string>, Row> rows;
  const auto repeat = [&](int u) { return units[static_cast<size_t>(u)].layer >= 0 ? layers : int64_t{1}; };
  be.set_counting(true);
  be.fill_zero(acc.view());
  model.accumulate_loss_into(acc.view());
  model.set_batch_pinned(ids, ids + o.seq_len, 1, o.seq_len, 1.0f / static_cast<float>(o.seq_len));
  collect(be, 1, rows);
  for (int u = 0; u < model.num_units(); ++u) {
    model.forward(u, st[static_cast<size_t>(u)].params.view());
    collect(be, repeat(u), rows);
  }
  for (int u = model.num_units() - 1; u >= 0; --u) {
    // The step's first (here only) micro-batch writes the gradients, as the engine's does.
    model.backward(u, st[static_cast<size_t>(u)].params.view(),
                   st[static_cast<size_t>(u)].grad.view(), model::Llama::Grads::kWrite);
    collect(be, repeat(u), rows);
  }
  be.fill_zero(sumsq.view());
  for (int u = 0; u < model.num_units(); ++u) {
    be.sum_squares_into(st[static_cast<size_t>(u)].grad.view(), sumsq.view());
    collect(be, repeat(u), rows);
  }
  be.clip_scale(sumsq.view(), 1.0, 1.0, scale.view());
  for (int u = 0; u < model.num_units(); ++u) {
    UnitState& s = st[static_cast<size_t>(u)];
    const engine::OsShard shard{0, units[static_cast<size_t>(u)].numel, s.master.view(), s.grad.view(),
                                s.m.view(), s.v.view(),
                                o.precision == DType::kBF16 ? s.params.view() : backend::View{}};
    engine::adamw_update_range(be, units[static_cast<size_t>(u)], shard, engine::AdamWOptions{}, 1e-4, 1,
                               scale.view());
    collect(be, repeat(u), rows);
  }
  double host[4];
  be.to_host_f64(acc.view(), host);
  collect(be, 1, rows);
  std::vector<Row> out;
  for (auto& [key, r] : rows) out.push_back(r);
  return out;
}

// Per call, summed over the whole model: count x repeat.
KernelTime scaled(const Row& r) {
  KernelTime k = r.k;
  k.calls *= r.repeat;
  k.launches *= r.repeat;
  k.host_syncs *= r.repeat;
  k.bytes *= r.repeat;
  k.min_bytes *= r.repeat;
  k.tensor_flops *= static_cast<double>(r.repeat);
  k.simt_flops *= static_cast<double>(r.repeat);
  return k;
}

void print_rows(const std::vector<Row>& rows) {
  std::printf("%-52s %5s %6s %9s %9s %6s %9s %9s %10s %s\n", "call (per layer: x layers)", "calls", "launch",
              "MB", "min MB", "x min", "TC GFLOP", "CC GFLOP", "H100 us", "bound");
  for (const Row& r : rows) {
    const KernelTime& k = r.k;
    const std::string name = (r.repeat > 1 ? "[layer] " : "") + k.name;
    const double ratio = k.min_bytes > 0 ? static_cast<double>(k.bytes) / static_cast<double>(k.min_bytes) : 0;
    std::printf("%-52.52s %5lld %6lld %9.1f %9.1f %6.2f %9.1f %9.1f %10.1f %s\n", name.c_str(),
                static_cast<long long>(k.calls), static_cast<long long>(k.launches), k.bytes / 1e6,
                k.min_bytes / 1e6, ratio, k.tensor_flops / 1e9, k.simt_flops / 1e9, roofline_s(k) * 1e6,
                memory_bound(k) ? "memory" : (k.simt_flops > k.tensor_flops ? "CUDA cores" : "tensor cores"));
  }
}

// The step's totals and the three goals.
void print_summary(const Options& o, const model::LlamaConfig& config, const std::vector<Row>& rows) {
  KernelTime step;
  double t = 0, t_adamw = 0, t_attention = 0, matmul_tc = 0, matmul_all = 0;
  std::vector<std::string> over;
  for (const Row& r : rows) {
    const KernelTime k = scaled(r);
    add_into(step, k);
    t += roofline_s(k);
    if (k.op == "adamw") t_adamw += roofline_s(k);
    if (k.op.rfind("attention", 0) == 0) t_attention += roofline_s(k);
    if (k.op.rfind("linear", 0) == 0 || k.op.rfind("attention", 0) == 0) {
      matmul_tc += k.tensor_flops;
      matmul_all += flops(k);
    }
    if (memory_bound(k) && k.min_bytes > 0 && static_cast<double>(k.bytes) > kBytesGoal * static_cast<double>(k.min_bytes))
      over.push_back(r.k.name);
  }
  const double model_flops = model::Llama::flops_per_token(config, o.seq_len) * static_cast<double>(o.seq_len);
  std::printf("\nstep of %s, %lld layers, seq %lld, %s (a model of an H100 SXM: %.2f TB/s, %.0f TFLOP/s bf16 "
              "tensor, %.0f TFLOP/s fp32)\n", config.name.c_str(), static_cast<long long>(config.num_hidden_layers),
              static_cast<long long>(o.seq_len), dtype_name(o.precision), kBandwidth / 1e12,
              kTensorPeak / 1e12, kSimtPeak / 1e12);
  std::printf("  backend calls %lld, stream operations %lld (%.2f per call; goal <= 2), host syncs %lld\n",
              static_cast<long long>(step.calls), static_cast<long long>(step.launches),
              static_cast<double>(step.launches) / static_cast<double>(std::max<int64_t>(step.calls, 1)),
              static_cast<long long>(step.host_syncs));
  std::printf("  device bytes %.2f GB, minimum %.2f GB (%.2fx)\n", step.bytes / 1e9, step.min_bytes / 1e9,
              static_cast<double>(step.bytes) / static_cast<double>(std::max<int64_t>(step.min_bytes, 1)));
  std::printf("  FLOPs: tensor cores %.1f TFLOP, CUDA cores %.1f TFLOP; matmul and attention FLOPs on tensor "
              "cores %.1f%% (goal 100%%)\n", step.tensor_flops / 1e12, step.simt_flops / 1e12,
              100.0 * matmul_tc / std::max(matmul_all, 1.0));
  std::printf("  memory-bound calls above %.2fx their minimum bytes: %zu%s\n", kBytesGoal, over.size(),
              over.empty() ? "" : " (");
  for (size_t i = 0; i < over.size(); ++i) std::printf("%s%s", over[i].c_str(), i + 1 < over.size() ? ", " : ")\n");
  std::printf("  roofline step %.1f ms: %.0f tokens/s, MFU at most %.1f%% (model FLOPs %.2f TFLOP per step)\n",
              t * 1e3, static_cast<double>(o.seq_len) / t, 100.0 * model_flops / (t * kTensorPeak),
              model_flops / 1e12);
  std::printf("  of which attention %.1f ms, AdamW %.1f ms (every parameter on this rank: 1/k of it with the "
              "optimizer states sharded over k ranks)\n", t_attention * 1e3, t_adamw * 1e3);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (!AMSP_CUDA_EMULATION) fail_usage("roofline_bench counts under the CUDA emulation; this is a real CUDA build");
    const Options o = parse(argc, argv);
    const model::LlamaConfig config = model::load_config(o.model);
    model::LlamaConfig one_layer = config;
    one_layer.num_hidden_layers = 1;
    one_layer.max_position_embeddings = std::max(one_layer.max_position_embeddings, o.seq_len);
#if AMSP_CUDA_EMULATION
    amsp::emu::set_dry_run(!o.execute);
#endif
    const std::vector<Row> rows = count_step(o, one_layer, config.num_hidden_layers);
    print_rows(rows);
    print_summary(o, config, rows);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "roofline_bench: %s\n", e.what());
    return 1;
  }
}
