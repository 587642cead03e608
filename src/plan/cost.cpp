#include "plan/cost.h"

#include <algorithm>

#include "core/error.h"
#include "model/llama.h"

namespace amsp::plan {

using comm::Op;

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::kForwardGather: return "forward gather";
    case Phase::kBackwardGather: return "backward gather";
    case Phase::kBackwardReduce: return "backward reduce";
    case Phase::kLastReduce: return "last micro-batch reduce";
    case Phase::kGradNorm: return "gradient norm";
    case Phase::kOptimizerGather: return "optimizer gather";
  }
  return "?";
}

int64_t micro_batches_per_step(int64_t global_batch_tokens, const Workload& w, int64_t world) {
  const int64_t per = w.tokens_per_micro_batch() * world;
  if (global_batch_tokens < per || global_batch_tokens % per != 0)
    fail_usage("--global-batch ", global_batch_tokens, ": expected a multiple of seq-len x "
               "micro-batch x ranks = ", w.seq_len, " x ", w.micro_batch, " x ", world, " = ",
               per, " tokens");
  return global_batch_tokens / per;
}

std::vector<Collective> step_collectives(const Workload& w, const ShardPlan& plan,
                                         const MeshShape& shape, int64_t micro_batches) {
  const Mesh mesh(plan, shape);
  // Parameters and gradients travel in the compute dtype, bP bytes: in bf16
  // the gradient reductions send bf16 although the G-shard accumulates in fp32.
  const int64_t wire = state_bytes(w.precision).p;
  const int64_t sp = plan.p.size(), sg = plan.g.size(), sos = plan.os.size(), d = shape.world();
  int64_t nodes[5];
  for (GroupKind k : kAllGroups) nodes[static_cast<int>(k)] = mesh.group_nodes(k);

  std::vector<Collective> list;
  auto issue = [&](Phase phase, int unit, Op op, GroupKind group, int64_t count, int64_t elem,
                   int64_t per_step) {
    Collective c;
    c.phase = phase;
    c.unit = unit;
    c.op = op;
    c.group = group;
    c.group_size = mesh.group_size(group);
    c.group_nodes = nodes[static_cast<int>(group)];
    c.count = count;
    c.elem_bytes = elem;
    c.per_step = per_step;
    c.traffic = comm::traffic_bytes(op, count, c.group_size, 0, 0, elem);
    list.push_back(c);
  };

  const std::vector<int64_t> numels = unit_numels(w.model);
  const int U = static_cast<int>(numels.size());
  std::vector<int64_t> phi(numels.size());
  for (size_t u = 0; u < numels.size(); ++u) phi[u] = padded_numel(numels[u], sos);
  const int64_t M = micro_batches;

  if (sp > 1)
    for (int u = 0; u < U; ++u)
      issue(Phase::kForwardGather, u, Op::kAllGather, GroupKind::kP, phi[u] / sp, wire, M);
  for (int u = U - 1; u >= 0; --u) {
    // The head's gathered copy from forward is reused by its backward.
    if (sp > 1 && u != U - 1)
      issue(Phase::kBackwardGather, u, Op::kAllGather, GroupKind::kP, phi[u] / sp, wire, M);
    if (sp > 1)
      issue(Phase::kBackwardReduce, u, Op::kReduceScatter, GroupKind::kP, phi[u] / sp, wire, M);
    if (sg > sp)
      issue(Phase::kBackwardReduce, u, Op::kReduceScatter, GroupKind::kG, phi[u] / sg, wire, M);
    if (sos > sg)
      issue(Phase::kLastReduce, u, Op::kReduceScatter, GroupKind::kOS, phi[u] / sos, wire, 1);
    if (d / sos > 1)
      issue(Phase::kLastReduce, u, Op::kAllReduce, GroupKind::kReplica, phi[u] / sos, wire, 1);
  }
  if (d > 1) {
    // The squared norm, summed in fp64 over one replica: every rank takes part
    // (ranks of other replicas contribute zero), so the group is the world.
    Collective c;
    c.phase = Phase::kGradNorm;
    c.op = Op::kAllReduce;
    c.group = GroupKind::kReplica;  // reported as "world"
    c.group_size = d;
    c.group_nodes = shape.nodes;
    c.count = 1;
    c.elem_bytes = 8;
    c.traffic = comm::traffic_bytes(Op::kAllReduce, 1, d, 0, 0, 8);
    list.push_back(c);
  }
  if (sos > sp)
    for (int u = 0; u < U; ++u)
      issue(Phase::kOptimizerGather, u, Op::kAllGather, GroupKind::kGather, phi[u] / sos, wire, 1);
  return list;
}

std::vector<Collective> paper_formulation(const std::vector<Collective>& amsp) {
  std::vector<Collective> out;
  for (Collective c : amsp) {
    const int64_t n = c.group_size;
    if (c.op == Op::kReduceScatter) {
      c.op = Op::kAllReduce;
      c.count *= n;
      c.traffic = comm::traffic_bytes(Op::kAllReduce, c.count, n, 0, 0, c.elem_bytes);
    } else if (c.op == Op::kAllGather) {
      c.op = Op::kBroadcast;
      c.calls = n;
      c.traffic = {};
      for (int64_t root = 0; root < n; ++root) {
        const comm::Traffic t = comm::traffic_bytes(Op::kBroadcast, c.count, n, 0, root, c.elem_bytes);
        c.traffic.sent += t.sent;
        c.traffic.received += t.received;
      }
    }
    c.seconds = 0;
    out.push_back(c);
  }
  return out;
}

void time_collectives(std::vector<Collective>& list, const BandwidthTable& table) {
  for (Collective& c : list) {
    const int64_t size = comm::bench_size_bytes(c.op, c.count, c.group_size, c.elem_bytes);
    c.seconds = static_cast<double>(c.calls) *
                table.seconds(c.op, size, c.ranks_per_node(), c.group_nodes);
  }
}

std::vector<double> unit_forward_flops(const Workload& w) {
  const model::LlamaConfig& c = w.model;
  const double h = static_cast<double>(c.hidden_size), kv = static_cast<double>(c.kv_dim()),
               I = static_cast<double>(c.intermediate_size), V = static_cast<double>(c.vocab_size),
               T = static_cast<double>(w.seq_len),
               tokens = static_cast<double>(w.tokens_per_micro_batch());
  const double layer = 2.0 * (2 * h * h + 2 * kv * h + 3 * h * I) + 2.0 * h * T;
  std::vector<double> flops;
  flops.push_back(0.0);  // the embedding is a lookup
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) flops.push_back(layer * tokens);
  flops.push_back(2.0 * V * h * tokens);
  return flops;
}

StepCost step_cost(const Workload& w, const std::vector<Collective>& timed, int64_t M,
                   const Compute& compute) {
  const std::vector<double> flops = unit_forward_flops(w);
  const int U = static_cast<int>(flops.size());
  std::vector<double> cf(U), cb(U);
  StepCost s;
  for (int u = 0; u < U; ++u) {
    cf[u] = flops[u] / compute.flops_per_s;
    cb[u] = 2 * cf[u];
    // Full recomputation runs each layer's forward again inside backward.
    if (w.recompute == Recompute::kFull && u > 0 && u < U - 1) cb[u] += cf[u];
    s.compute_s += static_cast<double>(M) * (cf[u] + cb[u]);
  }

  // Communication seconds per unit and phase, and the totals.
  std::vector<double> fg(U), bg(U), br(U), lr(U), og(U);
  double norm = 0;
  for (const Collective& c : timed) {
    const double t = c.seconds;
    s.comm_s += static_cast<double>(c.per_step) * t;
    const int64_t sent = c.per_step * c.traffic.sent, received = c.per_step * c.traffic.received;
    (c.inter_node() ? s.sent_inter : s.sent_intra) += sent;
    (c.inter_node() ? s.received_inter : s.received_intra) += received;
    switch (c.phase) {
      case Phase::kForwardGather: fg[c.unit] += t; break;
      case Phase::kBackwardGather: bg[c.unit] += t; break;
      case Phase::kBackwardReduce: br[c.unit] += t; break;
      case Phase::kLastReduce: lr[c.unit] += t; break;
      case Phase::kGradNorm: norm += t; break;
      case Phase::kOptimizerGather: og[c.unit] += t; break;
    }
  }

  // Exposed communication of one micro-batch. Each window is a stretch of
  // compute and the collectives that run beside it on the one communication
  // stream; what exceeds the compute is exposed.
  auto exposed = [&](bool first, bool last) {
    auto over = [](double comm, double comp) { return std::max(0.0, comm - comp); };
    double e = 0;
    // Forward: unit u+1's gathers run while unit u computes; unit 0's run
    // before anything (the previous step's optimizer gather feeds the first
    // micro-batch).
    e += over(fg[0] + (first ? og[0] : 0), 0);
    for (int u = 0; u < U; ++u) {
      const double comm = u + 1 < U ? fg[u + 1] + (first ? og[u + 1] : 0) : 0;
      e += over(comm, cf[u]);
    }
    // Backward, head first: unit u's backward hides the gather of unit u-1
    // and the reductions of unit u+1 (issued when its backward finished).
    for (int u = U - 1; u >= 0; --u) {
      double comm = u > 0 ? bg[u - 1] : 0;
      if (u + 1 < U) comm += br[u + 1] + (last ? lr[u + 1] : 0);
      e += over(comm, cb[u]);
    }
    // Then the embedding's reductions and the norm, with nothing to hide behind.
    e += br[0] + (last ? lr[0] + norm : 0);
    return e;
  };
  if (M == 1) {
    s.exposed_s = exposed(true, true);
  } else {
    s.exposed_s = exposed(true, false) + static_cast<double>(M - 2) * exposed(false, false) +
                  exposed(false, true);
  }
  s.step_s = s.compute_s + s.exposed_s;
  const double model_flops = model::Llama::flops_per_token(w.model, w.seq_len) *
                             static_cast<double>(w.tokens_per_micro_batch() * M);
  s.mfu = s.step_s > 0 ? model_flops / (s.step_s * compute.peak_flops_per_s) : 0;
  return s;
}

}  // namespace amsp::plan
