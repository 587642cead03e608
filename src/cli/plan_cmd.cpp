// amsp plan: options -> plan::PlanInput -> plan::search, printed as tables or JSON.

#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/plan_calibrate.h"
#include "cli/plan_sweep.h"
#include "cli/text.h"
#include "core/error.h"
#include "model/config.h"
#include "plan/schedule.h"
#include "plan/search.h"

namespace amsp::cli {
namespace {

using nlohmann::ordered_json;
using namespace amsp::plan;

std::string gib(int64_t bytes) { return fmt("%.1f", static_cast<double>(bytes) / 1073741824.0); }
std::string gb(int64_t bytes) { return fmt("%.2f", static_cast<double>(bytes) / 1e9); }

ordered_json eval_json(const Evaluation& e) {
  ordered_json j;
  j["plan"] = to_string(e.plan);
  j["compress"] = plan::to_string(e.compression);
  j["p"] = to_string(e.plan.p);
  j["g"] = to_string(e.plan.g);
  j["os"] = to_string(e.plan.os);
  j["fits"] = e.fits;
  j["memory_bytes"] = e.memory.total();
  j["memory"] = {{"params", e.memory.params},       {"grads", e.memory.grads},
                 {"optimizer", e.memory.optimizer}, {"activations", e.memory.activations},
                 {"gathered", e.memory.gathered},   {"buckets", e.memory.buckets}};
  j["node_nic_sent"] = e.cost.node.nic_sent;
  j["node_nic_received"] = e.cost.node.nic_received;
  j["node_intra"] = e.cost.node.intra;
  j["bytes_intra"] = e.cost.sent_intra;
  j["bytes_inter"] = e.cost.sent_inter;
  j["received_intra"] = e.cost.received_intra;
  j["received_inter"] = e.cost.received_inter;
  j["compute_s"] = e.cost.compute_s;
  j["comm_s"] = e.cost.comm_s;
  j["exposed_comm_s"] = e.cost.exposed_s;
  j["optimizer_s"] = e.cost.optimizer_s;
  j["step_time_s"] = e.cost.step_s;
  j["mfu"] = e.cost.mfu;
  j["hfu"] = e.cost.hfu;
  return j;
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

// Per node and step: NIC bytes out and in, bytes between the node's GPUs.
const char* kPlanHeader =
    "p      g      os        memory  NIC out GB  NIC in GB  intra GB   comm s  exposed s"
    "  optim s   step s    MFU";

std::string plan_row(const Evaluation& e) {
  return pad(to_string(e.plan.p), 7, false) + pad(to_string(e.plan.g), 7, false) +
         pad(to_string(e.plan.os), 7, false) + pad(gib(e.memory.total()), 8) +
         pad(gb(e.cost.node.nic_sent), 12) + pad(gb(e.cost.node.nic_received), 11) +
         pad(gb(e.cost.node.intra), 10) + pad(fmt("%.3f", e.cost.comm_s), 9) +
         pad(fmt("%.3f", e.cost.exposed_s), 11) + pad(fmt("%.3f", e.cost.optimizer_s), 9) +
         pad(fmt("%.3f", e.cost.step_s), 9) + pad(fmt("%.1f%%", 100 * e.cost.mfu), 7);
}

void print_paper(std::ostream& os, const Evaluation& amsp, const Evaluation& paper) {
  os << "  " << pad("formulation", 38, false) << pad("NIC out GB", 11) << pad("NIC in GB", 10)
     << pad("intra GB", 10) << pad("comm s", 9) << pad("exposed s", 11) << pad("step s", 9)
     << pad("MFU", 7) << "\n";
  auto row = [&](const char* name, const Evaluation& e) {
    os << "  " << pad(name, 38, false) << pad(gb(e.cost.node.nic_sent), 11)
       << pad(gb(e.cost.node.nic_received), 10) << pad(gb(e.cost.node.intra), 10)
       << pad(fmt("%.3f", e.cost.comm_s), 9) << pad(fmt("%.3f", e.cost.exposed_s), 11)
       << pad(fmt("%.3f", e.cost.step_s), 9) << pad(fmt("%.1f%%", 100 * e.cost.mfu), 7) << "\n";
  };
  row("amsp (reduce-scatter, all-gather)", amsp);
  row("paper (all-reduce + select, broadcast)", paper);
}

// --- the command, step by step ------------------------------------------------

// The command line as given.
struct PlanArgs {
  std::string model_name, cluster_name, bandwidth_path, gpu_memory, precision, recompute,
      global_batch, shard, overlap, sweep, plot, compress;
  int64_t nodes = 1, gpus_per_node = 0, ranks_per_node = 0, seq_len = 0, micro_batch = 0, top = 0;
  double peak_tflops = 0, achievable = 0, memory_margin = 0;
  InFlight in_flight;
  bool json = false;
};

po::options_description plan_options(PlanArgs& a) {
  po::options_description desc("Options");
  desc.add_options()
      ("model", po::value<std::string>(&a.model_name)->default_value("llama-7b")->value_name("NAME|FILE"),
           "model preset (inputs/models/NAME.json) or a Hugging Face config.json")
      ("nodes", po::value<int64_t>(&a.nodes)->default_value(1)->value_name("INT"), "nodes")
      ("gpus-per-node", po::value<int64_t>(&a.gpus_per_node)->value_name("INT"),
           "ranks per node (default: the cluster's GPUs per node)")
      ("ranks-per-node", po::value<int64_t>(&a.ranks_per_node)->value_name("INT"),
           "alias of --gpus-per-node")
      ("gpu-memory", po::value<std::string>(&a.gpu_memory)->value_name("SIZE"),
           "memory per rank: 80GiB, 80G (= GiB), 80GB (10^9 bytes) or bytes (default: the cluster's)")
      ("cluster", po::value<std::string>(&a.cluster_name)->default_value("a800")->value_name("NAME|FILE"),
           "cluster preset (inputs/clusters: a800, h100) or a cluster JSON file")
      ("bandwidth", po::value<std::string>(&a.bandwidth_path)->value_name("FILE"),
           "a measured `amsp comm-bench` table instead of the cluster's modelled one")
      ("precision", po::value<std::string>(&a.precision)->default_value("bf16")->value_name("bf16|fp32"),
           "bf16 mixed precision with Adam (2/4/12 bytes: fp32 gradient accumulator), or fp32 as on "
           "CPU (4/4/8)")
      ("seq-len", po::value<int64_t>(&a.seq_len)->default_value(4096)->value_name("INT"),
           "tokens per sequence")
      ("micro-batch", po::value<int64_t>(&a.micro_batch)->default_value(1)->value_name("INT"),
           "sequences per micro-batch per rank")
      ("global-batch", po::value<std::string>(&a.global_batch)->value_name("TOKENS"),
           "tokens per optimizer step over all ranks: 4194304 or 4M (K/M/G = 2^10/2^20/2^30); "
           "default: one micro-batch per rank")
      ("recompute", po::value<std::string>(&a.recompute)->default_value("none")->value_name("none|full"),
           "activation recomputation")
      ("compress", po::value<std::string>(&a.compress)->default_value("off")->value_name("SPEC"),
           "block-quantized collectives, as amsp train --compress (doc/compression.md)")
      ("peak-tflops", po::value<double>(&a.peak_tflops)->value_name("NUM"),
           "peak TFLOP/s per rank (default: the cluster's for the precision)")
      ("achievable", po::value<double>(&a.achievable)->value_name("NUM"),
           "fraction of peak the matmuls reach (default: the cluster's)")
      ("top", po::value<int64_t>(&a.top)->default_value(5)->value_name("INT"), "candidates to show")
      ("shard", po::value<std::string>(&a.shard)->default_value("auto")->value_name("PLAN"),
           "auto searches; a plan (ddp, zero1, zero2, zero3, fsdp, mics:K, p=AxB,g=..,os=..) "
           "is evaluated alone with its collectives")
      ("memory-margin", number(&a.memory_margin, kMemoryMargin)->value_name("F"),
           "fraction of --gpu-memory a plan may not use (CUDA context, NCCL buffers, fragmentation)")
      ("overlap", po::value<std::string>(&a.overlap)->default_value("on")->value_name("on|off"),
           "communication beside compute (on: the engine's schedule) or after it")
      ("calibrate", "print the model beside the AMSP paper's published MFU (for --cluster)")
      ("sweep", po::value<std::string>(&a.sweep)->value_name("GPUS"),
           "GPU counts, e.g. 8,16,32,64: ZeRO-1/2/3, MiCS, FSDP hybrid and the planner's choice "
           "at each, one table (MFU, tokens/s per GPU); replaces --nodes")
      ("plot", po::value<std::string>(&a.plot)->value_name("FILE.png"),
           "with --sweep: plot MFU against GPUs (needs python3-matplotlib)")
      ("schedule", "print the step's schedule for --shard PLAN (or the chosen plan): every "
                   "stage of every unit and the order every rank issues them in")
      ("json", "print one JSON object instead of tables");
  desc.add(in_flight_options(a.in_flight));
  desc.add(model_field_options());
  return desc;
}

// Range checks on the options, each naming the option it refuses.
void check_args(const PlanArgs& a, const po::variables_map& vm) {
  require(a.nodes >= 1, "nodes", a.nodes, "an integer >= 1");
  require(a.seq_len >= 1, "seq-len", a.seq_len, "an integer >= 1");
  require(a.micro_batch >= 1, "micro-batch", a.micro_batch, "an integer >= 1");
  require(a.top >= 1, "top", a.top, "an integer >= 1");
  require(a.precision == "bf16" || a.precision == "fp32", "precision", a.precision, "bf16 or fp32");
  require(a.recompute == "none" || a.recompute == "full", "recompute", a.recompute, "none or full");
  require(a.overlap == "on" || a.overlap == "off", "overlap", a.overlap, "on or off");
  check_in_flight(a.in_flight);
  require(a.memory_margin >= 0 && a.memory_margin < 1, "memory-margin", a.memory_margin,
          "a fraction in [0, 1)");
  if (vm.count("peak-tflops")) require(a.peak_tflops > 0, "peak-tflops", a.peak_tflops, "a number > 0");
  if (vm.count("achievable"))
    require(a.achievable > 0 && a.achievable <= 1, "achievable", a.achievable, "a number in (0, 1]");
  if (vm.count("gpus-per-node")) require(a.gpus_per_node >= 1, "gpus-per-node", a.gpus_per_node, "an integer >= 1");
  if (vm.count("ranks-per-node")) require(a.ranks_per_node >= 1, "ranks-per-node", a.ranks_per_node, "an integer >= 1");
  if (vm.count("gpus-per-node") && vm.count("ranks-per-node") && a.gpus_per_node != a.ranks_per_node)
    fail_usage("--ranks-per-node ", a.ranks_per_node, ": contradicts --gpus-per-node ", a.gpus_per_node,
               " (they are the same option)");
  if (vm.count("sweep")) {
    if (!vm["nodes"].defaulted())
      fail_usage("--nodes ", a.nodes, ": not with --sweep, whose GPU counts set the nodes");
    if (a.shard != "auto")
      fail_usage("--shard ", a.shard, ": not with --sweep, which evaluates its own systems");
    check_sweep(a.sweep,
                vm.count("gpus-per-node")    ? a.gpus_per_node
                : vm.count("ranks-per-node") ? a.ranks_per_node
                                             : load_cluster(a.cluster_name, "cluster").gpus_per_node,
                vm.count("global-batch") ? parse_token_count(a.global_batch, "global-batch") : 0,
                a.seq_len * a.micro_batch);
  } else if (vm.count("schedule") && (vm.count("json") || vm.count("calibrate"))) {
    fail_usage("--schedule: prints text for one plan; not with --", vm.count("json") ? "json" : "calibrate");
  } else if (vm.count("plot")) {
    fail_usage("--plot ", a.plot, ": expected with --sweep (it plots the sweep)");
  }
}

// What the planner is given, and where its numbers came from.
struct PlanSetup {
  PlanInput in;
  Cluster cluster;
  bool measured = false;  // --bandwidth replaced the cluster's table
  double fraction = 0;    // achievable fraction of peak
  int64_t M = 0;          // micro-batches per rank per step
};

PlanSetup plan_setup(const PlanArgs& a, const po::variables_map& vm) {
  PlanSetup s;
  PlanInput& in = s.in;
  Workload& w = in.workload;
  w.model = model::load_config(a.model_name);
  apply_model_fields(vm, w.model);
  w.model.validate();
  w.seq_len = a.seq_len;
  w.micro_batch = a.micro_batch;
  w.precision = a.precision == "bf16" ? Precision::kBf16 : Precision::kFp32;
  w.recompute = a.recompute == "none" ? Recompute::kNone : Recompute::kFull;
  w.compression = plan::parse_compression(a.compress);
  w.prefetch = a.in_flight.prefetch;
  w.max_reductions = a.in_flight.slots;

  s.cluster = load_cluster(a.cluster_name, "cluster");
  in.mesh.nodes = a.nodes;
  in.mesh.ranks_per_node = vm.count("gpus-per-node")    ? a.gpus_per_node
                           : vm.count("ranks-per-node") ? a.ranks_per_node
                                                        : s.cluster.gpus_per_node;
  in.memory_per_rank = vm.count("gpu-memory") ? parse_memory_size(a.gpu_memory, "gpu-memory")
                                              : s.cluster.gpu_memory;
  in.memory_margin = a.memory_margin;
  use_cluster(in, s.cluster);
  in.schedule.overlap = a.overlap == "on";
  s.measured = vm.count("bandwidth") > 0;
  if (s.measured) in.bandwidth = load_bandwidth_table(a.bandwidth_path, "bandwidth");
  if (vm.count("peak-tflops")) in.compute.peak_flops_per_s = a.peak_tflops * 1e12;
  s.fraction = vm.count("achievable") ? a.achievable : s.cluster.achievable;
  in.compute.flops_per_s = in.compute.peak_flops_per_s * s.fraction;
  const int64_t world = in.mesh.world();
  in.global_batch_tokens = vm.count("global-batch") ? parse_token_count(a.global_batch, "global-batch")
                                                    : w.tokens_per_micro_batch() * world;
  s.M = micro_batches_per_step(in.global_batch_tokens, w, world);
  return s;
}

ordered_json input_json(const PlanArgs& a, const PlanSetup& s) {
  const Workload& w = s.in.workload;
  ordered_json input;
  input["model"] = w.model.name;
  input["parameters"] = w.model.num_parameters();
  input["nodes"] = a.nodes;
  input["gpus_per_node"] = s.in.mesh.ranks_per_node;
  input["world"] = s.in.mesh.world();
  input["gpu_memory_bytes"] = s.in.memory_per_rank;
  input["memory_margin"] = s.in.memory_margin;
  input["usable_memory_bytes"] = s.in.usable_memory();
  input["overlap"] = s.in.schedule.overlap;
  input["prefetch_units"] = w.prefetch;
  input["reduction_slots"] = w.max_reductions;
  input["cluster"] = s.cluster.name;
  input["bandwidth"] = s.measured ? a.bandwidth_path : s.cluster.source;
  input["bandwidth_modelled"] = !s.measured && s.cluster.modelled;
  input["precision"] = precision_name(w.precision);
  input["recompute"] = recompute_name(w.recompute);
  input["compress"] = plan::to_string(w.compression);
  input["seq_len"] = a.seq_len;
  input["micro_batch"] = a.micro_batch;
  input["global_batch_tokens"] = s.in.global_batch_tokens;
  input["micro_batches_per_step"] = s.M;
  input["peak_tflops"] = s.in.compute.peak_flops_per_s / 1e12;
  input["achievable_fraction"] = s.fraction;
  return input;
}

void print_header(std::ostream& os, const PlanArgs& a, const PlanSetup& s) {
  const PlanInput& in = s.in;
  const Workload& w = in.workload;
  const Cluster& cluster = s.cluster;
  os << "amsp plan: " << w.model.name << " (" << fmt("%.2f", w.model.num_parameters() / 1e9)
     << " B parameters) on " << a.nodes << " nodes x " << in.mesh.ranks_per_node << " GPUs = "
     << in.mesh.world() << " ranks, " << format_memory(in.memory_per_rank) << " per GPU (plans may use "
     << format_memory(in.usable_memory()) << ", a " << fmt("%.0f%%", 100 * in.memory_margin)
     << " margin)\n";
  os << "cluster " << cluster.name << ": " << cluster.description << "\n";
  if (s.measured)
    os << "bandwidth: measured table " << a.bandwidth_path << " (memory and peak from cluster "
       << cluster.name << ")\n";
  else
    os << "bandwidth: " << (cluster.modelled ? "MODELLED, not measured (" : "from ")
       << cluster.source << (cluster.modelled ? "); measure with amsp comm-bench, pass --bandwidth" : "")
       << "\n";
  os << "batch: " << in.global_batch_tokens << " tokens per step = " << s.M
     << " micro-batch(es) of " << a.micro_batch << " x " << a.seq_len << " tokens per rank; "
     << precision_name(w.precision) << ", recompute " << recompute_name(w.recompute)
     << (w.compression.any() || w.compression.choose ? ", compress " + plan::to_string(w.compression)
                                                       : std::string())
     << "\n";
  os << "compute: " << fmt("%.4g", in.compute.flops_per_s / 1e12) << " TFLOP/s per rank ("
     << fmt("%.4g", in.compute.peak_flops_per_s / 1e12) << " peak x " << fmt("%.2f", s.fraction)
     << "); bytes per node per step (GB = 10^9), memory per rank in GiB\n";
  const Effects& f = in.effects;
  os << "effects: contention " << fmt("%.2f", f.contention) << ", stragglers "
     << fmt("%.1f%%", 100 * f.jitter_1024) << " at 1024 ranks, "
     << (f.nodes_per_switch > 0 ? std::to_string(f.nodes_per_switch) + " nodes per leaf switch"
                                : std::string("one switch"))
     << ", spine " << fmt("%.3g", f.oversubscription) << ":1, optimizer at "
     << fmt("%.4g", f.memory_bytes_per_s / 1e9) << " GB/s"
     << (in.schedule.overlap ? "" : "; overlap OFF") << "\n\n";
}

// --shard PLAN: one plan, with its collectives and the paper's formulation.
void report_one_plan(std::ostream& os, const PlanArgs& a, const PlanSetup& s) {
  const PlanInput& in = s.in;
  const ShardPlan plan = parse_shard_plan(a.shard, in.mesh);
  const Evaluation e = evaluate(in, plan);
  const Evaluation paper = evaluate_paper(in, e);
  if (a.json) {
    ordered_json j;
    j["input"] = input_json(a, s);
    j["plan"] = eval_json(e);
    j["plan"]["name"] = plan.name;
    j["plan"]["collectives"] = collectives_json(e.collectives);
    j["paper"] = eval_json(paper);
    j["paper"]["collectives"] = collectives_json(paper.collectives);
    os << j.dump(2) << "\n";
    return;
  }
  print_header(os, a, s);
  os << "plan " << plan.name << ": " << to_string(plan) << "\n" << kPlanHeader << "\n"
     << plan_row(e) << "\n";
  if (!e.fits)
    os << "does not fit: needs " << format_memory(e.memory.total()) << " per GPU, may use "
       << format_memory(in.usable_memory()) << "\n";
  os << "memory per rank: params " << format_memory(e.memory.params) << ", grads "
     << format_memory(e.memory.grads) << ", optimizer " << format_memory(e.memory.optimizer)
     << ", activations " << format_memory(e.memory.activations) << ", gathered units "
     << format_memory(e.memory.gathered) << ", gradient buckets " << format_memory(e.memory.buckets)
     << "\ncompute " << fmt("%.3f", e.cost.compute_s) << " s + exposed communication "
     << fmt("%.3f", e.cost.exposed_s) << " s + optimizer " << fmt("%.3f", e.cost.optimizer_s)
     << " s = step " << fmt("%.3f", e.cost.step_s) << " s\n\n"
     << "collectives per step (summed over units; bytes per rank):\n";
  print_collectives(os, e.collectives);
  os << "\nthe paper's formulation of this plan:\n";
  print_paper(os, e, paper);
}

// --schedule: the plan's step schedule (plan/schedule.h), the chosen one for auto.
void report_schedule(std::ostream& os, const PlanArgs& a, const PlanSetup& s) {
  ShardPlan plan;
  Workload w = s.in.workload;
  if (a.shard != "auto") {
    plan = parse_shard_plan(a.shard, s.in.mesh);
    if (w.compression.choose) w.compression = evaluate(s.in, plan).compression;
  } else {
    const std::vector<Evaluation> ranked = search(s.in);
    if (ranked.empty() || !ranked.front().fits)
      fail_usage("--schedule: no plan fits ", format_memory(s.in.usable_memory()),
                 " per GPU; name one with --shard");
    plan = ranked.front().plan;
    w.compression = ranked.front().compression;
  }
  os << "plan " << to_string(plan) << " on " << s.in.mesh.nodes << " nodes x "
     << s.in.mesh.ranks_per_node << " ranks, " << w.model.name
     << (w.compression.any() ? ", compress " + plan::to_string(w.compression) : std::string()) << "\n"
     << format_schedule(step_schedule(w, plan, s.in.mesh), s.M);
}

// The outcome of the search: every valid plan ranked, and the named ones.
struct SearchResult {
  std::vector<Evaluation> ranked;
  int64_t fitting = 0;
  std::vector<NamedResult> named;
  const Evaluation* best() const { return fitting > 0 ? &ranked.front() : nullptr; }
};

SearchResult run_search(const PlanInput& in) {
  SearchResult r;
  r.ranked = search(in);
  for (const Evaluation& e : r.ranked) r.fitting += e.fits ? 1 : 0;
  r.named = named_results(in, r.ranked);
  return r;
}

void print_search_json(std::ostream& os, const PlanArgs& a, const PlanSetup& s, const SearchResult& r) {
  ordered_json j;
  j["input"] = input_json(a, s);
  j["valid_plans"] = r.ranked.size();
  j["fitting_plans"] = r.fitting;
  j["candidates"] = ordered_json::array();
  for (int64_t i = 0; i < std::min<int64_t>(a.top, r.fitting); ++i)
    j["candidates"].push_back(eval_json(r.ranked[static_cast<size_t>(i)]));
  ordered_json nj = ordered_json::object();
  for (const NamedResult& n : r.named) {
    ordered_json x = n.eval ? eval_json(*n.eval) : ordered_json::object();
    if (!n.excluded.empty()) x["excluded"] = n.excluded;
    if (n.rank > 0) x["rank"] = n.rank;
    nj[n.name] = x;
  }
  j["named"] = nj;
  if (const Evaluation* best = r.best()) {
    j["chosen"] = to_string(best->plan);
    j["paper"] = eval_json(evaluate_paper(s.in, *best));
  }
  os << j.dump(2) << "\n";
}

// The best candidates, then the named plans with their rank or why excluded.
void print_candidates(std::ostream& os, const PlanArgs& a, const PlanSetup& s, const SearchResult& r) {
  os << r.ranked.size() << " valid plans, " << r.fitting << " fit in "
     << format_memory(s.in.usable_memory()) << "; best first (least exposed communication, then "
        "fewest NIC bytes per node, then least memory):\n";
  os << "rank  " << kPlanHeader << "\n";
  for (int64_t i = 0; i < std::min<int64_t>(a.top, r.fitting); ++i)
    os << pad(std::to_string(i + 1), 4) << "  " << plan_row(r.ranked[static_cast<size_t>(i)]) << "\n";
  if (r.fitting == 0) os << "  (none)\n";

  os << "\nnamed plans:\n" << pad("name", 10, false) << kPlanHeader << "  rank\n";
  for (const NamedResult& n : r.named) {
    os << pad(n.name, 10, false);
    if (!n.eval) {
      os << "excluded: " << n.excluded << "\n";
      continue;
    }
    os << plan_row(*n.eval) << "  ";
    if (n.excluded.empty())
      os << n.rank << "\n";
    else
      os << "excluded: " << n.excluded << "\n";
  }
}

// The chosen plan, why, how the named plans compare, and the paper's formulation.
void print_choice(std::ostream& os, const PlanInput& in, const SearchResult& r, const Evaluation& best) {
  os << "\nchosen: " << to_string(best.plan)
     << (in.workload.compression.choose ? ", compress " + plan::to_string(best.compression) : std::string())
     << ", predicted step " << fmt("%.3f", best.cost.step_s)
     << " s, MFU " << fmt("%.1f%%", 100 * best.cost.mfu) << ", "
     << format_memory(best.memory.total()) << " per GPU\n";
  if (r.fitting > 1)
    os << "why: against the runner-up (" << to_string(r.ranked[1].plan) << "), "
       << why_better(best, r.ranked[1]) << "\n";
  else
    os << "why: the only plan that fits\n";
  os << "per step each node sends " << gb(best.cost.node.nic_sent) << " GB and receives "
     << gb(best.cost.node.nic_received) << " GB through its NICs and moves "
     << gb(best.cost.node.intra) << " GB between its GPUs; " << fmt("%.3f", best.cost.exposed_s)
     << " s of " << fmt("%.3f", best.cost.comm_s) << " s of communication is not hidden\n";
  for (const NamedResult& n : r.named)
    if (n.eval && n.excluded.empty() && n.rank > 1)
      os << "  " << n.name << " is rank " << n.rank << ": step " << fmt("%.3f", n.eval->cost.step_s)
         << " s (" << fmt("%+.2f%%", 100 * (n.eval->cost.step_s / best.cost.step_s - 1)) << "), "
         << format_memory(n.eval->memory.total()) << "\n";

  os << "\nthe paper's formulation of the chosen plan:\n";
  print_paper(os, best, evaluate_paper(in, best));
}

// --shard auto: the search, as JSON or as tables.
void report_search(std::ostream& os, const PlanArgs& a, const PlanSetup& s) {
  const SearchResult r = run_search(s.in);
  if (a.json) {
    print_search_json(os, a, s, r);
    return;
  }
  print_header(os, a, s);
  print_candidates(os, a, s, r);
  if (const Evaluation* best = r.best()) {
    print_choice(os, s.in, r, *best);
    return;
  }
  const Evaluation& smallest = r.ranked.front();
  os << "\nno plan fits " << format_memory(s.in.usable_memory()) << " per GPU; the smallest ("
     << to_string(smallest.plan) << ") needs " << format_memory(smallest.memory.total())
     << ": add nodes, shorten --seq-len or --micro-batch, or --recompute full\n";
}

}  // namespace

int run_plan(int argc, char** argv) {
  PlanArgs a;
  const po::options_description desc = plan_options(a);
  po::variables_map vm;
  if (!parse_command("plan",
                     "Chooses how to shard parameters, gradients and optimizer states for a "
                     "model, a cluster and a batch, and explains the choice.",
                     desc, argc, argv, vm))
    return 0;
  a.json = vm.count("json") > 0;
  check_args(a, vm);
  if (vm.count("calibrate"))
    return print_calibration(std::cout, load_cluster(a.cluster_name, "cluster"), a.json);
  const PlanSetup setup = plan_setup(a, vm);
  if (vm.count("sweep"))
    return run_sweep(std::cout, {setup.in, setup.cluster, setup.measured ? a.bandwidth_path : "",
                                 a.sweep, vm.count("global-batch") > 0, a.plot, a.json});
  if (vm.count("schedule"))
    report_schedule(std::cout, a, setup);
  else if (a.shard != "auto")
    report_one_plan(std::cout, a, setup);
  else
    report_search(std::cout, a, setup);
  return 0;
}

}  // namespace amsp::cli
