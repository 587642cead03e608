#include "engine/config_table.h"

#include <algorithm>
#include <cstdio>

#include "backend/factory.h"
#include "core/error.h"

namespace amsp::engine {
namespace {

// Where the peak for MFU comes from when --peak-tflops does not give it.
const char* peak_source(Device device) {
  if (device == Device::kCpu) return " (GEMM, measured)";
  return backend::cuda_emulated() ? " (CPU GEMM, measured: the device is emulated)"
                                    : " (bf16 dense peak of the device, by name)";
}

}  // namespace

std::string format_table(const std::vector<std::pair<std::string, std::string>>& rows) {
  size_t key_width = 0, value_width = 0;
  for (const auto& [key, value] : rows) {
    key_width = std::max(key_width, key.size());
    value_width = std::max(value_width, value.size());
  }
  std::string rule = "+";
  rule.append(key_width + 2, '-').append("+").append(value_width + 2, '-').append("+\n");
  std::string out = rule;
  for (const auto& [key, value] : rows)
    out += "| " + key + std::string(key_width - key.size(), ' ') + " | " + value +
           std::string(value_width - value.size(), ' ') + " |\n";
  return out + rule;
}

namespace {

// "900000 / 47000"; a mixture's per source: "900000 / 47000 + 30000 / 2048".
std::string split_sizes(const data::Mixture& data) {
  std::string out;
  for (size_t i = 0; i < data.size(); ++i)
    out += cat(i ? " + " : "", data.dataset(i).size(data::Split::kTrain), " / ",
               data.dataset(i).size(data::Split::kValid));
  return out;
}

// How the train splits are read (data/token_column.h), once per distinct way.
std::string read_layouts(const data::Mixture& data) {
  std::vector<std::string> seen;
  for (size_t i = 0; i < data.size(); ++i) {
    const std::string l = data.dataset(i).layout(data::Split::kTrain);
    if (std::find(seen.begin(), seen.end(), l) == seen.end()) seen.push_back(l);
  }
  std::string out;
  for (const std::string& l : seen) out += (out.empty() ? "" : "; ") + l;
  return out;
}

}  // namespace

void print_config(const TrainOptions& o, const data::Mixture& data, double peak_flops,
                  int threads, const topology::Topology& topo, const PlanGroups& pg,
                  const ShardedEngine& engine, const std::string& backend) {
  const auto& m = o.model;
  const int64_t tokens = o.batch_size * o.seq_len * o.grad_accum * topo.world_size;
  const std::string table = format_table({
      {"model", m.name},
      {"parameters", cat(m.num_parameters(), " (", m.num_parameters() / 1e6, " M)")},
      {"hidden_size", std::to_string(m.hidden_size)},
      {"intermediate_size", std::to_string(m.intermediate_size)},
      {"num_hidden_layers", std::to_string(m.num_hidden_layers)},
      {"num_attention_heads", std::to_string(m.num_attention_heads)},
      {"num_key_value_heads", std::to_string(m.num_key_value_heads)},
      {"vocab_size", std::to_string(m.vocab_size)},
      {"rms_norm_eps / rope_theta", cat(m.rms_norm_eps, " / ", m.rope_theta)},
      {"ranks",
       cat(topo.world_size, " on ", topo.num_nodes, " node(s), ", topo.local_size, " per node")},
      {"shard plan", plan::to_string(pg.mesh.plan())},
      {"backend, precision", cat(backend, ", ", dtype_name(o.precision))},
      {"model states per rank",
       cat(engine.model_state_bytes() / 1e6, " MB (+ ", engine.temporary_bytes() / 1e6,
           " MB in flight: ",
           pg.mesh.plan().p.size() > 1 ? cat(o.prefetch_units, " units prefetched, ") : "",
           o.reduction_slots, " reduction slots)")},
      {"data", data.describe()},
      {"train / validation tokens", split_sizes(data)},
      {"data read", read_layouts(data)},
      {"steps", std::to_string(o.steps)},
      {"batch x seq x accum x ranks", cat(o.batch_size, " x ", o.seq_len, " x ", o.grad_accum,
                                          " x ", topo.world_size, " = ", tokens, " tokens/step")},
      {"lr (warmup, min)",
       cat(o.schedule.lr, " (", o.schedule.warmup_steps, " steps, ", o.schedule.min_lr, ")")},
      {"adamw betas, eps, wd",
       cat(o.adamw.beta1, ", ", o.adamw.beta2, ", ", o.adamw.eps, ", ", o.adamw.weight_decay)},
      {"grad clip", o.grad_clip > 0 ? cat(o.grad_clip) : "off"},
      {"seed", std::to_string(o.seed)},
      {"threads per rank", std::to_string(threads)},
      {"peak per rank for MFU",
       cat(peak_flops / 1e9, " GFLOP/s", o.peak_tflops > 0 ? " (given)" : peak_source(o.device))},
  });
  std::fputs(table.c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace amsp::engine
