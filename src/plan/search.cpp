#include "plan/search.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <tuple>

#include "core/error.h"
#include "core/parse.h"

namespace amsp::plan {

int64_t PlanInput::usable_memory() const {
  return static_cast<int64_t>(static_cast<double>(memory_per_rank) * (1.0 - memory_margin));
}

void use_cluster(PlanInput& in, const Cluster& cluster) {
  in.bandwidth = cluster.bandwidth;
  in.effects = cluster.effects;
  const double peak = 1e12 * (in.workload.precision == Precision::kBf16 ? cluster.peak_tflops_bf16
                                                                        : cluster.peak_tflops_fp32);
  in.compute.peak_flops_per_s = peak;
  in.compute.flops_per_s = peak * cluster.achievable;
}

std::vector<ShardPlan> enumerate_plans(const MeshShape& mesh) {
  const int64_t R = mesh.ranks_per_node, N = mesh.nodes;
  std::vector<Factor> factors;
  for (int64_t s0 = 1; s0 <= R; ++s0)
    if (R % s0 == 0) factors.push_back({s0, 1});
  for (int64_t s1 = 2; s1 <= N; ++s1)
    if (N % s1 == 0) factors.push_back({R, s1});
  auto divides = [](const Factor& a, const Factor& b) {
    return b.s0 % a.s0 == 0 && b.s1 % a.s1 == 0;
  };
  std::vector<ShardPlan> plans;
  for (const Factor& p : factors)
    for (const Factor& g : factors)
      for (const Factor& os : factors) {
        if (!divides(p, g) || !divides(g, os)) continue;
        ShardPlan plan{p, g, os, "custom"};
        validate(plan, mesh);
        plans.push_back(plan);
      }
  return plans;
}

namespace {

// Times e's collectives and costs the step.
void cost(const PlanInput& in, Evaluation& e) {
  const int64_t M = micro_batches_per_step(in.global_batch_tokens, in.workload, in.mesh.world());
  time_collectives(e.collectives, in.bandwidth, in.effects);
  e.cost = step_cost(in.workload, e.collectives, M, in.compute, in.schedule, in.effects,
                     optimizer_seconds(in.workload, e.plan, in.effects));
}

}  // namespace

Evaluation evaluate(const PlanInput& in, const ShardPlan& plan) {
  if (in.workload.compression.choose) {
    // Off first: a tie keeps the exact collectives.
    PlanInput each = in;
    each.workload.compression = {};
    Evaluation best = evaluate(each, plan);
    for (const Compression& c : compression_candidates()) {
      each.workload.compression = c;
      Evaluation e = evaluate(each, plan);
      if (e.fits == best.fits ? better(e, best) : e.fits) best = std::move(e);
    }
    return best;
  }
  const int64_t M = micro_batches_per_step(in.global_batch_tokens, in.workload, in.mesh.world());
  Evaluation e;
  e.plan = plan;
  e.compression = in.workload.compression;
  e.memory = memory_per_rank(in.workload, plan, in.mesh);
  e.fits = e.memory.total() <= in.usable_memory();
  e.collectives = step_collectives(in.workload, plan, in.mesh, M, in.schedule,
                                   in.effects.nodes_per_switch);
  cost(in, e);
  return e;
}

Evaluation evaluate_paper(const PlanInput& in, const Evaluation& amsp) {
  Evaluation p = amsp;
  p.collectives = paper_formulation(amsp.collectives);
  cost(in, p);
  return p;
}

double exposed_ticks(const Evaluation& e) {
  // Compute is the same for every plan of one input, so step time ranks as
  // exposed communication does; differences under kTieResolution of the
  // compute time are below what the model can resolve and count as ties.
  const double tick = kTieResolution * e.cost.compute_s;
  return tick > 0 ? std::floor(e.cost.exposed_s / tick) : e.cost.exposed_s;
}

bool better(const Evaluation& a, const Evaluation& b) {
  auto key = [](const Evaluation& e) {
    return std::make_tuple(exposed_ticks(e), e.cost.nic_bytes(), e.memory.total(),
                           e.cost.node.intra, e.cost.step_s, e.plan.p.s1, e.plan.p.s0,
                           e.plan.g.s1, e.plan.g.s0, e.plan.os.s1, e.plan.os.s0);
  };
  return key(a) < key(b);
}

std::vector<Evaluation> search(const PlanInput& in) {
  std::vector<Evaluation> all;
  for (const ShardPlan& plan : enumerate_plans(in.mesh)) all.push_back(evaluate(in, plan));
  std::sort(all.begin(), all.end(), [](const Evaluation& a, const Evaluation& b) {
    if (a.fits != b.fits) return a.fits;
    if (a.fits) return better(a, b);
    if (a.memory.total() != b.memory.total()) return a.memory.total() < b.memory.total();
    return better(a, b);
  });
  return all;
}

Evaluation choose_plan(const PlanInput& in) {
  std::vector<Evaluation> ranked = search(in);
  if (ranked.empty() || !ranked.front().fits) {
    const int64_t least = ranked.empty() ? 0 : ranked.front().memory.total();
    fail_usage("--shard auto: no shard plan fits ", format_memory(in.usable_memory()),
               " per rank (", format_memory(in.memory_per_rank), " less the ",
               static_cast<int>(std::lround(100 * in.memory_margin)),
               "% margin); the smallest (", ranked.empty() ? "none" : to_string(ranked.front().plan),
               ") needs ", format_memory(least),
               " (shard over more ranks, shorten --seq-len or --micro-batch, or recompute)");
  }
  return ranked.front();
}

std::vector<std::string> named_plan_names(const MeshShape& mesh) {
  const int64_t R = mesh.ranks_per_node;
  return {"ddp", "zero1", "zero2", "zero3", cat("mics:", R), cat("mics:", 2 * R),
          cat("mics:", 4 * R)};
}

std::vector<NamedResult> named_results(const PlanInput& in, const std::vector<Evaluation>& ranked) {
  std::vector<NamedResult> out;
  for (const std::string& name : named_plan_names(in.mesh)) {
    NamedResult r;
    r.name = name;
    ShardPlan plan;
    try {
      plan = parse_shard_plan(name, in.mesh);
    } catch (const UsageError& e) {
      std::string why = e.what();
      const std::string prefix = "--shard " + name + ": ";
      if (why.rfind(prefix, 0) == 0) why = why.substr(prefix.size());
      r.excluded = why;
      out.push_back(r);
      continue;
    }
    int place = 0;
    for (const Evaluation& e : ranked) {
      if (!e.fits) break;
      ++place;
      if (e.plan == plan) {
        r.rank = place;
        break;
      }
    }
    r.eval = evaluate(in, plan);
    r.eval->plan.name = name;
    if (!r.eval->fits) {
      r.rank = 0;
      r.excluded = cat("needs ", format_memory(r.eval->memory.total()), " per GPU, may use ",
                       format_memory(in.usable_memory()));
    }
    out.push_back(r);
  }
  return out;
}

std::string why_better(const Evaluation& a, const Evaluation& b) {
  auto secs = [](double s) { return cat(format_fixed(s, 3), " s"); };
  auto gbs = [](int64_t bytes) { return cat(format_fixed(static_cast<double>(bytes) / 1e9, 2), " GB"); };
  if (exposed_ticks(a) != exposed_ticks(b))
    return cat("it exposes less communication: ", secs(a.cost.exposed_s), " against ",
               secs(b.cost.exposed_s), " per step");
  const std::string tie = cat("both expose ", secs(a.cost.exposed_s), " and ", secs(b.cost.exposed_s),
                              " (a tie: within ", format_fixed(100 * kTieResolution, 1),
                              "% of the compute time); ");
  if (a.cost.nic_bytes() != b.cost.nic_bytes())
    return cat(tie, "it moves fewer bytes through each node's NICs: ", gbs(a.cost.nic_bytes()),
               " against ", gbs(b.cost.nic_bytes()), " per step");
  if (a.memory.total() != b.memory.total())
    return cat(tie, "the same NIC bytes (", gbs(a.cost.nic_bytes()), "); it needs less memory: ",
               format_memory(a.memory.total()), " against ", format_memory(b.memory.total()));
  return cat(tie, "the same NIC bytes and memory; it moves fewer bytes inside the node: ",
             gbs(a.cost.node.intra), " against ", gbs(b.cost.node.intra));
}

int64_t parse_token_count(const std::string& text, const std::string& option) {
  std::string number = text, unit;
  while (!number.empty() && std::isalpha(static_cast<unsigned char>(number.back()))) {
    unit.insert(unit.begin(), number.back());
    number.pop_back();
  }
  int64_t scale = 0;
  if (unit.empty()) scale = 1;
  if (unit == "K" || unit == "Ki" || unit == "k") scale = int64_t{1} << 10;
  if (unit == "M" || unit == "Mi") scale = int64_t{1} << 20;
  if (unit == "G" || unit == "Gi") scale = int64_t{1} << 30;
  const auto v = parse_int(number);
  if (scale == 0 || !v || *v < 1 || *v > (int64_t{1} << 62) / scale)
    fail_usage("--", option, " ", text,
               ": expected a token count such as 4194304 or 4M (K, M, G are powers of 1024)");
  return *v * scale;
}

}  // namespace amsp::plan
