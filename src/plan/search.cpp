#include "plan/search.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <tuple>

#include "core/error.h"
#include "core/parse.h"

namespace amsp::plan {

void use_cluster(PlanInput& in, const Cluster& cluster) {
  in.bandwidth = cluster.bandwidth;
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

Evaluation evaluate(const PlanInput& in, const ShardPlan& plan) {
  const int64_t M = micro_batches_per_step(in.global_batch_tokens, in.workload, in.mesh.world());
  Evaluation e;
  e.plan = plan;
  e.memory = memory_per_rank(in.workload, plan, in.mesh.world());
  e.fits = e.memory.total() <= in.memory_per_rank;
  e.collectives = step_collectives(in.workload, plan, in.mesh, M);
  time_collectives(e.collectives, in.bandwidth);
  e.cost = step_cost(in.workload, e.collectives, M, in.compute);
  return e;
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
    return std::make_tuple(exposed_ticks(e), e.memory.total(), e.cost.sent_inter,
                           e.cost.sent_intra, e.cost.step_s, e.plan.p.s1, e.plan.p.s0,
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
    fail_usage("--shard auto: no shard plan fits ", format_gib(in.memory_per_rank),
               " per rank; the smallest (", ranked.empty() ? "none" : to_string(ranked.front().plan),
               ") needs ", format_gib(least),
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
      r.excluded = cat("needs ", format_gib(r.eval->memory.total()), " per GPU, has ",
                       format_gib(in.memory_per_rank));
    }
    out.push_back(r);
  }
  return out;
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
