#include "plan/memory.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

#include "comm/traffic.h"
#include "core/error.h"
#include "core/parse.h"
#include "model/layout.h"
#include "plan/schedule.h"

namespace amsp::plan {

const char* precision_name(Precision p) { return p == Precision::kBf16 ? "bf16" : "fp32"; }
const char* recompute_name(Recompute r) { return r == Recompute::kNone ? "none" : "full"; }

StateBytes state_bytes(Precision precision) {
  if (precision == Precision::kBf16) return {2, 4, 12};
  return {4, 4, 8};
}

std::vector<int64_t> unit_numels(const model::LlamaConfig& config) {
  std::vector<int64_t> numels;
  for (const auto& u : model::build_layout(config)) numels.push_back(u.numel);
  return numels;
}

int64_t padded_numel(int64_t numel, int64_t s_os) { return comm::padded_count(numel, s_os); }

int64_t attention_saved_count(AttentionSaved saved, int64_t B, int64_t T, int64_t heads) {
  return saved == AttentionSaved::kProbabilities ? B * heads * T * T : B * heads * T;
}

int64_t model_activation_bytes(const model::LlamaConfig& c, int64_t B, int64_t T, bool recompute,
                               DType compute, int64_t saved) {
  // Mirrors Llama::Llama's allocations, buffer by buffer: 4 bytes an element,
  // and the buffers in the products' dtype (the compute dtype) `p` bytes.
  const int64_t p = dtype_bytes(compute);
  const int64_t N = B * T, h = c.hidden_size, kv = c.kv_dim(), I = c.intermediate_size,
                V = c.vocab_size, L = c.num_hidden_layers;
  const int64_t rope = 4 * 2 * T * (c.head_dim() / 2);       // cos, sin
  const int64_t per_layer = p * (N * h + 2 * N * kv)         // q, k, v side by side
                            + 4 * saved                      // what attention keeps
                            + p * N * h + 4 * N * h          // attention output, h
                            + p * 2 * N * I                  // gate and up side by side
                            + 4 * 2 * N;                     // 1/rms of both norms
  const int64_t resid = 4 * (L + 1) * N * h;                 // layer inputs + final output
  const int64_t head = 4 * (N + N) + p * N * V;              // 1/rms, log-sum-exp; logits
  // n, dn, dattn; dres (and its bf16 copy); dqkv; act (d(act) in backward); dgate_up
  const int64_t dres = 4 * N * h + (p == 4 ? 0 : p * N * h);
  const int64_t scratch = p * 3 * N * h + dres + p * N * (h + 2 * kv) + p * N * I + p * 2 * N * I;
  const int64_t ids = 4 * 2 * N;                             // token ids and targets (int32)
  // Recomputation keeps every layer's input (resid) and one layer's working set.
  return ids + rope + resid + (recompute ? 1 : L) * per_layer + head + scratch;
}

int64_t activation_bytes(const Workload& w) {
  const model::LlamaConfig& c = w.model;
  const bool fp32 = w.precision == Precision::kFp32;
  const AttentionSaved saved =
      w.attention.value_or(fp32 ? AttentionSaved::kProbabilities : AttentionSaved::kLogSumExp);
  return model_activation_bytes(
      c, w.micro_batch, w.seq_len, w.recompute == Recompute::kFull,
      fp32 ? DType::kF32 : DType::kBF16,
      attention_saved_count(saved, w.micro_batch, w.seq_len, c.num_attention_heads));
}

MemoryBreakdown memory_per_rank(const Workload& w, const ShardPlan& plan, int64_t world) {
  return memory_per_rank(w, plan, MeshShape{world, 1});
}

MemoryBreakdown memory_per_rank(const Workload& w, const ShardPlan& plan, const MeshShape& shape) {
  const StateBytes b = state_bytes(w.precision);
  const int64_t p_ranks = plan.p.size(), g_ranks = plan.g.size(), os_ranks = plan.os.size();
  MemoryBreakdown m;
  int64_t largest = 0;  // max Φu
  for (int64_t numel : unit_numels(w.model)) {
    const int64_t phi = padded_numel(numel, os_ranks);
    largest = std::max(largest, phi);
    m.params += phi / p_ranks * b.p;
    m.grads += phi / g_ranks * b.g;
    m.optimizer += phi / os_ranks * b.os;
  }
  m.activations = activation_bytes(w);

  // Temporaries, exactly the buffers the sharding engine allocates. Each is
  // sized for the largest unit, in the compute dtype (bP bytes: what travels).
  //
  // Gathered units (s_p > 1): the unit computing plus `prefetch` whose
  // all-gathers over the P group are in flight, each a full unit.
  // A compressed all-gather adds its records, sent and received, per buffer.
  const StepSchedule steps = step_schedule(w, plan, shape);
  if (p_ranks > 1)
    m.gathered = (w.prefetch + 1) * (largest * b.p + 4 * (steps.gather_qsend + steps.gather_qrecv));
  // Reduction slots: `max_reductions` reductions can be outstanding, each
  // holding its unit's gradient on the way from backward to the OS-shard in
  // the slot buffers its stages name (plan/schedule.h: full, p, g, os).
  // Compressed reductions add their records, sent and received, per slot.
  m.buckets = w.max_reductions * (steps.slot.total() * b.p + 4 * (steps.slot.qsend + steps.slot.qrecv));
  return m;
}

int64_t parse_memory_size(const std::string& text, const std::string& option) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string number = text.substr(0, i), unit = text.substr(i);
  const auto v = parse_double(number);
  struct Unit {
    const char* name;
    double bytes;
  };
  static const Unit kUnits[] = {
      {"", 1},           {"B", 1},           {"KiB", 1024.0},   {"MiB", 1048576.0},
      {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}, {"K", 1024.0}, {"M", 1048576.0},
      {"G", 1073741824.0},   {"T", 1099511627776.0},   {"KB", 1e3},   {"MB", 1e6},
      {"GB", 1e9},           {"TB", 1e12}};
  for (const Unit& u : kUnits) {
    if (unit != u.name || !v || *v <= 0) continue;
    const double bytes = *v * u.bytes;
    if (bytes < 1 || bytes > 9e18 || (unit.empty() && number.find('.') != std::string::npos)) break;
    return static_cast<int64_t>(std::llround(bytes));
  }
  fail_usage("--", option, " ", text,
             ": expected a size such as 80GiB, 80GB (10^9 bytes), 80G (= GiB) or a byte count");
}

std::string format_memory(int64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  char buf[32];
  if (bytes < 1024 && bytes > -1024) {
    std::snprintf(buf, sizeof buf, "%lld bytes", static_cast<long long>(bytes));
    return buf;
  }
  double v = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (unit < 3 && (v >= 1024 || v <= -1024)) v /= 1024, ++unit;
  std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[unit]);
  return buf;
}

std::string format_fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

}  // namespace amsp::plan
