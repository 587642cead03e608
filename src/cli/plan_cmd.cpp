// amsp plan: options -> plan::PlanInput -> plan::search, printed as tables or JSON.

#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "model/config.h"
#include "plan/search.h"

namespace amsp::cli {
namespace {

using nlohmann::ordered_json;
using namespace amsp::plan;

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}
std::string gib(int64_t bytes) { return fmt("%.1f", static_cast<double>(bytes) / 1073741824.0); }
std::string gb(int64_t bytes) { return fmt("%.2f", static_cast<double>(bytes) / 1e9); }
std::string pad(std::string s, size_t width, bool right = true) {
  if (s.size() >= width) return s;
  return right ? std::string(width - s.size(), ' ') + s : s + std::string(width - s.size(), ' ');
}

ordered_json eval_json(const Evaluation& e) {
  ordered_json j;
  j["plan"] = to_string(e.plan);
  j["p"] = to_string(e.plan.p);
  j["g"] = to_string(e.plan.g);
  j["os"] = to_string(e.plan.os);
  j["fits"] = e.fits;
  j["memory_bytes"] = e.memory.total();
  j["memory"] = {{"params", e.memory.params},       {"grads", e.memory.grads},
                 {"optimizer", e.memory.optimizer}, {"activations", e.memory.activations},
                 {"gathered", e.memory.gathered},   {"buckets", e.memory.buckets}};
  j["bytes_intra"] = e.cost.sent_intra;
  j["bytes_inter"] = e.cost.sent_inter;
  j["received_intra"] = e.cost.received_intra;
  j["received_inter"] = e.cost.received_inter;
  j["compute_s"] = e.cost.compute_s;
  j["comm_s"] = e.cost.comm_s;
  j["exposed_comm_s"] = e.cost.exposed_s;
  j["step_time_s"] = e.cost.step_s;
  j["mfu"] = e.cost.mfu;
  return j;
}

// The same plan in the paper's formulation (all-reduce + select, broadcasts).
Evaluation paper_eval(const PlanInput& in, const Evaluation& e) {
  Evaluation p = e;
  p.collectives = paper_formulation(e.collectives);
  time_collectives(p.collectives, in.bandwidth);
  p.cost = step_cost(in.workload, p.collectives,
                     micro_batches_per_step(in.global_batch_tokens, in.workload, in.mesh.world()),
                     in.compute);
  return p;
}

std::string group_label(const Collective& c) {
  if (c.phase == Phase::kGradNorm) return "world";
  return group_name(c.group);
}

// Collectives summed over units: one row per (phase, op, group).
ordered_json collectives_json(const std::vector<Collective>& list) {
  ordered_json rows = ordered_json::array();
  std::map<std::tuple<int, int, int>, size_t> index;
  for (const Collective& c : list) {
    const auto key = std::make_tuple(static_cast<int>(c.phase), static_cast<int>(c.op),
                                     static_cast<int>(c.group));
    if (!index.count(key)) {
      index[key] = rows.size();
      ordered_json r;
      r["phase"] = phase_name(c.phase);
      r["op"] = comm::op_name(c.op);
      r["group"] = group_label(c);
      r["group_shape"] = cat(c.ranks_per_node(), "x", c.group_nodes);
      r["inter_node"] = c.inter_node();
      r["elem_bytes"] = c.elem_bytes;
      r["calls_per_step"] = 0;
      r["elements_per_step"] = 0;
      r["bytes_sent"] = 0;
      r["bytes_received"] = 0;
      r["seconds"] = 0.0;
      rows.push_back(r);
    }
    ordered_json& r = rows[index[key]];
    r["calls_per_step"] = r["calls_per_step"].get<int64_t>() + c.per_step * c.calls;
    r["elements_per_step"] = r["elements_per_step"].get<int64_t>() + c.per_step * c.calls * c.count;
    r["bytes_sent"] = r["bytes_sent"].get<int64_t>() + c.per_step * c.traffic.sent;
    r["bytes_received"] = r["bytes_received"].get<int64_t>() + c.per_step * c.traffic.received;
    r["seconds"] = r["seconds"].get<double>() + static_cast<double>(c.per_step) * c.seconds;
  }
  return rows;
}

void print_collectives(std::ostream& os, const std::vector<Collective>& list) {
  os << "  " << pad("phase", 24, false) << pad("op", 15, false) << pad("group", 8, false)
     << pad("shape", 8, false) << pad("calls", 7) << pad("elements", 14) << pad("sent GB", 10)
     << pad("recv GB", 10) << "  where   " << pad("seconds", 8) << "\n";
  for (const auto& r : collectives_json(list)) {
    os << "  " << pad(r["phase"].get<std::string>(), 24, false)
       << pad(r["op"].get<std::string>(), 15, false) << pad(r["group"].get<std::string>(), 8, false)
       << pad(r["group_shape"].get<std::string>(), 8, false)
       << pad(std::to_string(r["calls_per_step"].get<int64_t>()), 7)
       << pad(std::to_string(r["elements_per_step"].get<int64_t>()), 14)
       << pad(gb(r["bytes_sent"].get<int64_t>()), 10) << pad(gb(r["bytes_received"].get<int64_t>()), 10)
       << "  " << (r["inter_node"].get<bool>() ? "inter   " : "intra   ")
       << pad(fmt("%.4f", r["seconds"].get<double>()), 8) << "\n";
  }
}

const char* kPlanHeader =
    "p      g      os       memory = P     + G     + OS    + act   + tmp   intra GB  inter GB"
    "   comm s  exposed s   step s    MFU";

std::string plan_row(const Evaluation& e) {
  const MemoryBreakdown& m = e.memory;
  return pad(to_string(e.plan.p), 7, false) + pad(to_string(e.plan.g), 7, false) +
         pad(to_string(e.plan.os), 7, false) + pad(gib(m.total()), 8) + pad(gib(m.params), 8) +
         pad(gib(m.grads), 8) + pad(gib(m.optimizer), 8) + pad(gib(m.activations), 8) +
         pad(gib(m.temporaries()), 8) + pad(gb(e.cost.sent_intra), 10) +
         pad(gb(e.cost.sent_inter), 10) + pad(fmt("%.3f", e.cost.comm_s), 9) +
         pad(fmt("%.3f", e.cost.exposed_s), 11) + pad(fmt("%.3f", e.cost.step_s), 9) +
         pad(fmt("%.1f%%", 100 * e.cost.mfu), 7);
}

void print_paper(std::ostream& os, const Evaluation& amsp, const Evaluation& paper) {
  os << "  " << pad("formulation", 38, false) << pad("sent intra GB", 14) << pad("sent inter GB", 14)
     << pad("recv GB", 10) << pad("comm s", 9) << pad("exposed s", 11) << pad("step s", 9)
     << pad("MFU", 7) << "\n";
  auto row = [&](const char* name, const Evaluation& e) {
    os << "  " << pad(name, 38, false) << pad(gb(e.cost.sent_intra), 14)
       << pad(gb(e.cost.sent_inter), 14)
       << pad(gb(e.cost.received_intra + e.cost.received_inter), 10)
       << pad(fmt("%.3f", e.cost.comm_s), 9) << pad(fmt("%.3f", e.cost.exposed_s), 11)
       << pad(fmt("%.3f", e.cost.step_s), 9) << pad(fmt("%.1f%%", 100 * e.cost.mfu), 7) << "\n";
  };
  row("amsp (reduce-scatter, all-gather)", amsp);
  row("paper (all-reduce + select, broadcast)", paper);
}

}  // namespace

int run_plan(int argc, char** argv) {
  std::string model_name, cluster_name, bandwidth_path, gpu_memory, precision, recompute,
      global_batch, shard;
  int64_t nodes = 1, gpus_per_node = 0, ranks_per_node = 0, seq_len = 0, micro_batch = 0, top = 0;
  double peak_tflops = 0, achievable = 0;

  po::options_description desc("Options");
  desc.add_options()
      ("model", po::value<std::string>(&model_name)->default_value("llama-7b")->value_name("NAME|FILE"),
           "model preset (inputs/models/NAME.json) or a Hugging Face config.json")
      ("nodes", po::value<int64_t>(&nodes)->default_value(1)->value_name("INT"), "nodes")
      ("gpus-per-node", po::value<int64_t>(&gpus_per_node)->value_name("INT"),
           "ranks per node (default: the cluster's GPUs per node)")
      ("ranks-per-node", po::value<int64_t>(&ranks_per_node)->value_name("INT"),
           "alias of --gpus-per-node")
      ("gpu-memory", po::value<std::string>(&gpu_memory)->value_name("SIZE"),
           "memory per rank: 80GiB, 80G (= GiB), 80GB (10^9 bytes) or bytes (default: the cluster's)")
      ("cluster", po::value<std::string>(&cluster_name)->default_value("a800")->value_name("NAME|FILE"),
           "cluster preset (inputs/clusters: a800, h100) or a cluster JSON file")
      ("bandwidth", po::value<std::string>(&bandwidth_path)->value_name("FILE"),
           "a measured `amsp comm-bench` table instead of the cluster's modelled one")
      ("precision", po::value<std::string>(&precision)->default_value("bf16")->value_name("bf16|fp32"),
           "bf16 mixed precision with Adam (2/4/12 bytes: fp32 gradient accumulator), or fp32 as on "
           "CPU (4/4/8)")
      ("seq-len", po::value<int64_t>(&seq_len)->default_value(4096)->value_name("INT"),
           "tokens per sequence")
      ("micro-batch", po::value<int64_t>(&micro_batch)->default_value(1)->value_name("INT"),
           "sequences per micro-batch per rank")
      ("global-batch", po::value<std::string>(&global_batch)->value_name("TOKENS"),
           "tokens per optimizer step over all ranks: 4194304 or 4M (K/M/G = 2^10/2^20/2^30); "
           "default: one micro-batch per rank")
      ("recompute", po::value<std::string>(&recompute)->default_value("none")->value_name("none|full"),
           "activation recomputation")
      ("peak-tflops", po::value<double>(&peak_tflops)->value_name("NUM"),
           "peak TFLOP/s per rank (default: the cluster's for the precision)")
      ("achievable", po::value<double>(&achievable)->value_name("NUM"),
           "fraction of peak the matmuls reach (default: the cluster's)")
      ("top", po::value<int64_t>(&top)->default_value(5)->value_name("INT"), "candidates to show")
      ("shard", po::value<std::string>(&shard)->default_value("auto")->value_name("PLAN"),
           "auto searches; a plan (ddp, zero1, zero2, zero3, fsdp, mics:K, p=AxB,g=..,os=..) "
           "is evaluated alone with its collectives")
      ("json", "print one JSON object instead of tables");
  desc.add(model_field_options());

  po::variables_map vm;
  if (!parse_command("plan",
                     "Chooses how to shard parameters, gradients and optimizer states for a "
                     "model, a cluster and a batch, and explains the choice.",
                     desc, argc, argv, vm))
    return 0;

  require(nodes >= 1, "nodes", nodes, "an integer >= 1");
  require(seq_len >= 1, "seq-len", seq_len, "an integer >= 1");
  require(micro_batch >= 1, "micro-batch", micro_batch, "an integer >= 1");
  require(top >= 1, "top", top, "an integer >= 1");
  require(precision == "bf16" || precision == "fp32", "precision", precision, "bf16 or fp32");
  require(recompute == "none" || recompute == "full", "recompute", recompute, "none or full");
  if (vm.count("peak-tflops")) require(peak_tflops > 0, "peak-tflops", peak_tflops, "a number > 0");
  if (vm.count("achievable"))
    require(achievable > 0 && achievable <= 1, "achievable", achievable, "a number in (0, 1]");
  if (vm.count("gpus-per-node")) require(gpus_per_node >= 1, "gpus-per-node", gpus_per_node, "an integer >= 1");
  if (vm.count("ranks-per-node")) require(ranks_per_node >= 1, "ranks-per-node", ranks_per_node, "an integer >= 1");
  if (vm.count("gpus-per-node") && vm.count("ranks-per-node") && gpus_per_node != ranks_per_node)
    fail_usage("--ranks-per-node ", ranks_per_node, ": contradicts --gpus-per-node ", gpus_per_node,
               " (they are the same option)");

  PlanInput in;
  Workload& w = in.workload;
  w.model = model::load_config(model_name);
  apply_model_fields(vm, w.model);
  w.model.validate();
  w.seq_len = seq_len;
  w.micro_batch = micro_batch;
  w.precision = precision == "bf16" ? Precision::kBf16 : Precision::kFp32;
  w.recompute = recompute == "none" ? Recompute::kNone : Recompute::kFull;
  if (w.precision == Precision::kFp32 && w.recompute == Recompute::kFull)
    fail_usage("--recompute full: the fp32 (CPU) model keeps every activation; expected none "
               "with --precision fp32");

  const Cluster cluster = load_cluster(cluster_name, "cluster");
  in.mesh.nodes = nodes;
  in.mesh.ranks_per_node = vm.count("gpus-per-node")    ? gpus_per_node
                           : vm.count("ranks-per-node") ? ranks_per_node
                                                        : cluster.gpus_per_node;
  in.memory_per_rank = vm.count("gpu-memory") ? parse_memory_size(gpu_memory, "gpu-memory")
                                              : cluster.gpu_memory;
  use_cluster(in, cluster);
  const bool measured = vm.count("bandwidth") > 0;
  if (measured) in.bandwidth = load_bandwidth_table(bandwidth_path, "bandwidth");
  if (vm.count("peak-tflops")) in.compute.peak_flops_per_s = peak_tflops * 1e12;
  const double fraction = vm.count("achievable") ? achievable : cluster.achievable;
  in.compute.flops_per_s = in.compute.peak_flops_per_s * fraction;
  const int64_t world = in.mesh.world();
  in.global_batch_tokens = vm.count("global-batch") ? parse_token_count(global_batch, "global-batch")
                                                    : w.tokens_per_micro_batch() * world;
  const int64_t M = micro_batches_per_step(in.global_batch_tokens, w, world);
  const bool json_out = vm.count("json") > 0;

  ordered_json input;
  input["model"] = w.model.name;
  input["parameters"] = w.model.num_parameters();
  input["nodes"] = nodes;
  input["gpus_per_node"] = in.mesh.ranks_per_node;
  input["world"] = world;
  input["gpu_memory_bytes"] = in.memory_per_rank;
  input["cluster"] = cluster.name;
  input["bandwidth"] = measured ? bandwidth_path : cluster.source;
  input["bandwidth_modelled"] = !measured && cluster.modelled;
  input["precision"] = precision_name(w.precision);
  input["recompute"] = recompute_name(w.recompute);
  input["seq_len"] = seq_len;
  input["micro_batch"] = micro_batch;
  input["global_batch_tokens"] = in.global_batch_tokens;
  input["micro_batches_per_step"] = M;
  input["peak_tflops"] = in.compute.peak_flops_per_s / 1e12;
  input["achievable_fraction"] = fraction;

  std::ostream& os = std::cout;
  auto print_header = [&] {
    os << "amsp plan: " << w.model.name << " (" << fmt("%.2f", w.model.num_parameters() / 1e9)
       << " B parameters) on " << nodes << " nodes x " << in.mesh.ranks_per_node << " GPUs = "
       << world << " ranks, " << format_gib(in.memory_per_rank) << " per GPU\n";
    os << "cluster " << cluster.name << ": " << cluster.description << "\n";
    if (measured)
      os << "bandwidth: measured table " << bandwidth_path << " (memory and peak from cluster "
         << cluster.name << ")\n";
    else
      os << "bandwidth: " << (cluster.modelled ? "MODELLED, not measured (" : "from ")
         << cluster.source << (cluster.modelled ? "); measure with amsp comm-bench, pass --bandwidth" : "")
         << "\n";
    os << "batch: " << in.global_batch_tokens << " tokens per step = " << M
       << " micro-batch(es) of " << micro_batch << " x " << seq_len << " tokens per rank; "
       << precision_name(w.precision) << ", recompute " << recompute_name(w.recompute) << "\n";
    os << "compute: " << fmt("%.4g", in.compute.flops_per_s / 1e12) << " TFLOP/s per rank ("
       << fmt("%.4g", in.compute.peak_flops_per_s / 1e12) << " peak x " << fmt("%.2f", fraction)
       << "); bytes are sent per rank per step (GB = 10^9), memory per rank in GiB\n\n";
  };

  // --shard PLAN: one plan, with its collectives.
  if (shard != "auto") {
    ShardPlan plan = parse_shard_plan(shard, in.mesh);
    const Evaluation e = evaluate(in, plan);
    const Evaluation paper = paper_eval(in, e);
    if (json_out) {
      ordered_json j;
      j["input"] = input;
      j["plan"] = eval_json(e);
      j["plan"]["name"] = plan.name;
      j["plan"]["collectives"] = collectives_json(e.collectives);
      j["paper"] = eval_json(paper);
      j["paper"]["collectives"] = collectives_json(paper.collectives);
      os << j.dump(2) << "\n";
      return 0;
    }
    print_header();
    os << "plan " << plan.name << ": " << to_string(plan) << "\n" << kPlanHeader << "\n"
       << plan_row(e) << "\n";
    if (!e.fits)
      os << "does not fit: needs " << format_gib(e.memory.total()) << " per GPU, has "
         << format_gib(in.memory_per_rank) << "\n";
    os << "memory per rank: params " << format_gib(e.memory.params) << ", grads "
       << format_gib(e.memory.grads) << ", optimizer " << format_gib(e.memory.optimizer)
       << ", activations " << format_gib(e.memory.activations) << ", gathered units "
       << format_gib(e.memory.gathered) << ", gradient buckets " << format_gib(e.memory.buckets)
       << "\ncompute " << fmt("%.3f", e.cost.compute_s) << " s + exposed communication "
       << fmt("%.3f", e.cost.exposed_s) << " s = step " << fmt("%.3f", e.cost.step_s) << " s\n\n"
       << "collectives per step (summed over units):\n";
    print_collectives(os, e.collectives);
    os << "\nthe paper's formulation of this plan:\n";
    print_paper(os, e, paper);
    return 0;
  }

  const std::vector<Evaluation> ranked = search(in);
  int64_t fitting = 0;
  for (const Evaluation& e : ranked) fitting += e.fits ? 1 : 0;
  const std::vector<NamedResult> named = named_results(in, ranked);
  const Evaluation* best = fitting > 0 ? &ranked.front() : nullptr;

  if (json_out) {
    ordered_json j;
    j["input"] = input;
    j["valid_plans"] = ranked.size();
    j["fitting_plans"] = fitting;
    j["candidates"] = ordered_json::array();
    for (int64_t i = 0; i < std::min<int64_t>(top, fitting); ++i)
      j["candidates"].push_back(eval_json(ranked[static_cast<size_t>(i)]));
    ordered_json nj = ordered_json::object();
    for (const NamedResult& r : named) {
      ordered_json x = r.eval ? eval_json(*r.eval) : ordered_json::object();
      if (!r.excluded.empty()) x["excluded"] = r.excluded;
      if (r.rank > 0) x["rank"] = r.rank;
      nj[r.name] = x;
    }
    j["named"] = nj;
    if (best) {
      j["chosen"] = to_string(best->plan);
      j["paper"] = eval_json(paper_eval(in, *best));
    }
    os << j.dump(2) << "\n";
    return 0;
  }

  print_header();
  os << ranked.size() << " valid plans, " << fitting << " fit in " << format_gib(in.memory_per_rank)
     << "; best first:\n";
  os << "rank  " << kPlanHeader << "\n";
  for (int64_t i = 0; i < std::min<int64_t>(top, fitting); ++i)
    os << pad(std::to_string(i + 1), 4) << "  " << plan_row(ranked[static_cast<size_t>(i)]) << "\n";
  if (fitting == 0) os << "  (none)\n";

  os << "\nnamed plans:\n" << pad("name", 10, false) << kPlanHeader << "  rank\n";
  for (const NamedResult& r : named) {
    os << pad(r.name, 10, false);
    if (!r.eval) {
      os << "excluded: " << r.excluded << "\n";
      continue;
    }
    os << plan_row(*r.eval) << "  ";
    if (r.excluded.empty())
      os << r.rank << "\n";
    else
      os << "excluded: " << r.excluded << "\n";
  }

  if (!best) {
    os << "\nno plan fits " << format_gib(in.memory_per_rank) << " per GPU; the smallest ("
       << to_string(ranked.front().plan) << ") needs " << format_gib(ranked.front().memory.total())
       << ": add nodes, shorten --seq-len or --micro-batch, or --recompute full\n";
    return 0;
  }
  os << "\nchosen: " << to_string(best->plan) << ", predicted step " << fmt("%.3f", best->cost.step_s)
     << " s, MFU " << fmt("%.1f%%", 100 * best->cost.mfu) << ", "
     << format_gib(best->memory.total()) << " per GPU\n";
  const Evaluation* fastest = best;
  for (const Evaluation& e : ranked)
    if (e.fits && e.cost.step_s < fastest->cost.step_s) fastest = &e;
  if (fastest == best) {
    os << "why: the fastest predicted step of the " << fitting << " plans that fit";
  } else {
    os << "why: within " << fmt("%.1f%%", 100 * kTieResolution)
       << " of compute time of the fastest predicted step (" << to_string(fastest->plan) << ", "
       << fmt("%.3f", fastest->cost.step_s) << " s, " << format_gib(fastest->memory.total())
       << "), a difference the model cannot resolve, and the least memory among those";
  }
  os << "; it sends " << gb(best->cost.sent_inter) << " GB across nodes and "
     << gb(best->cost.sent_intra) << " GB inside nodes per rank per step, "
     << fmt("%.3f", best->cost.exposed_s) << " s of it not hidden by compute\n";
  for (const NamedResult& r : named)
    if (r.eval && r.excluded.empty() && r.rank > 1)
      os << "  " << r.name << " is rank " << r.rank << ": step " << fmt("%.3f", r.eval->cost.step_s)
         << " s (" << fmt("%+.2f%%", 100 * (r.eval->cost.step_s / best->cost.step_s - 1)) << "), "
         << format_gib(r.eval->memory.total()) << "\n";

  os << "\nthe paper's formulation of the chosen plan:\n";
  print_paper(os, *best, paper_eval(in, *best));
  return 0;
}

}  // namespace amsp::cli
