#include "plan/cost.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/llama.h"

namespace amsp::plan {

using comm::Op;

int64_t micro_batches_per_step(int64_t global_batch_tokens, const Workload& w, int64_t world) {
  const int64_t per = w.tokens_per_micro_batch() * world;
  if (global_batch_tokens < per || global_batch_tokens % per != 0)
    fail_usage("--global-batch ", global_batch_tokens, ": expected a multiple of seq-len x "
               "micro-batch x ranks = ", w.seq_len, " x ", w.micro_batch, " x ", world, " = ",
               per, " tokens");
  return global_batch_tokens / per;
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Elements of the collective's whole buffer (nccl-tests' size, in elements).
int64_t bench_elements(const Collective& c) {
  return comm::bench_size_bytes(c.op, c.count, c.group_size, c.elem_bytes) / c.elem_bytes;
}

// Leaf switches under which the nodes of a group of this kind sit (the one
// holding position 0; every group of a kind has the same stride). Nodes are
// ordered by switch path, so node k sits under switch k / nodes_per_switch.
int64_t group_switches(const Mesh& mesh, GroupKind kind, int64_t nodes_per_switch) {
  if (nodes_per_switch <= 0 || mesh.group_nodes(kind) <= 1) return 1;
  const int64_t R = mesh.shape().ranks_per_node;
  int64_t count = 0, last = -1;
  for (int64_t pos : mesh.group_members(kind, 0)) {
    const int64_t sw = pos / R / nodes_per_switch;
    if (sw != last) ++count;  // members are in position order
    last = sw;
  }
  return count;
}

// Bytes through one node's NICs for one group, per occurrence (all calls):
// what must cross the node boundary, as a ring or a hierarchical algorithm
// moves it. All-gather and reduce-scatter: the p0·c elements of each of the
// other p1 - 1 nodes' members, in and out; all-reduce of c elements:
// 2(p1 - 1)/p1 · c (reduce-scatter and all-gather across the nodes, each
// node's p0 ranks taking a slice); the paper's broadcasts as the all-gather.
int64_t nic_bytes_per_group(const Collective& c) {
  const int64_t p1 = c.group_nodes, p0 = c.ranks_per_node();
  if (p1 <= 1) return 0;
  if (c.op == Op::kAllReduce) return 2 * (p1 - 1) * c.count * c.elem_bytes / p1;
  const int64_t per_call = (p1 - 1) * p0 * c.count * c.elem_bytes;
  return c.op == Op::kBroadcast ? per_call * c.calls / c.group_size : per_call;
}

// The node's bytes of one collective from its per-rank traffic: the R/p0
// groups of its kind with members on a node all run at once.
void account_node(Collective& c) {
  const int64_t nic = nic_bytes_per_group(c);
  const int64_t ranks_sent = c.ranks_per_node() * c.traffic.sent;
  c.node.nic_sent = c.node.nic_received = c.groups_per_node * nic;
  c.node.intra = c.groups_per_node * std::max<int64_t>(0, ranks_sent - nic);
}

// What a compressed stage's local steps read and write: quantizing reads its
// values and writes a record, per record; dequantizing reads the records and
// writes the values; a summing dequantization reads the records and reads and
// writes the sum once; the add after it reads two and writes one. Values count
// at `value_bytes`; the records are the stage's words per rank, 4 bytes each.
int64_t local_bytes(const Stage& s, int64_t value_bytes) {
  if (!s.compressed) return 0;
  const int64_t record = 4 * s.count, values = value_bytes * s.values;
  int64_t bytes = 0;
  for (const LocalStep* l : {&s.before, &s.after, &s.and_then}) {
    switch (l->kind) {
      case LocalStep::kQuantize:
      case LocalStep::kDequantize: bytes += l->records * (values + record); break;
      case LocalStep::kDequantizeSum: bytes += l->records * record + 2 * values; break;
      case LocalStep::kAdd: bytes += 3 * values; break;
      case LocalStep::kCopy: bytes += 2 * values; break;
      case LocalStep::kNone: break;
    }
  }
  return bytes;
}

// The per-rank traffic and the node's bytes of a newly issued collective.
void account(Collective& c, const MeshShape& shape) {
  c.traffic = comm::traffic_bytes(c.op, c.count, c.group_size, 0, 0, c.elem_bytes);
  c.groups_per_node = shape.ranks_per_node / c.ranks_per_node();
  account_node(c);
}

}  // namespace

std::vector<Collective> step_collectives(const Workload& w, const ShardPlan& plan,
                                         const MeshShape& shape, int64_t micro_batches,
                                         const Schedule& schedule, int64_t nodes_per_switch) {
  const Mesh mesh(plan, shape);
  const StepSchedule steps = step_schedule(w, plan, shape);
  int64_t nodes[5], switches[5];
  for (GroupKind k : kAllGroups) {
    nodes[static_cast<int>(k)] = mesh.group_nodes(k);
    switches[static_cast<int>(k)] = group_switches(mesh, k, nodes_per_switch);
  }
  const int64_t M = micro_batches;

  std::vector<Collective> list;
  auto issue = [&](const Stage& s, Phase phase) {
    Collective c;
    c.phase = phase;
    c.unit = s.unit;
    c.part = s.part;
    c.op = s.op;
    c.group = s.group;
    c.count = s.count;
    c.elem_bytes = dtype_bytes(s.dtype);
    c.chained = s.chained;
    c.per_step = s.runs == Runs::kEveryMicroBatch ? M : 1;
    // Gathered parameters are wire values; a reduction's sums are fp32.
    c.local_bytes = local_bytes(s, s.op == Op::kAllGather ? dtype_bytes(steps.wire) : 4);
    if (phase == Phase::kGradNorm) {
      c.group_size = shape.world();
      c.group_nodes = shape.nodes;
      c.switches = nodes_per_switch > 0 ? ceil_div(shape.nodes, nodes_per_switch) : 1;
    } else {
      c.group_size = mesh.group_size(s.group);
      c.group_nodes = nodes[static_cast<int>(s.group)];
      c.switches = switches[static_cast<int>(s.group)];
      const int64_t bucket = c.op == Op::kAllGather ? schedule.gather_bucket : schedule.reduce_bucket;
      c.buckets = bucket > 0 ? ceil_div(bench_elements(c), bucket) : 1;
    }
    account(c, shape);
    list.push_back(c);
  };

  const int U = steps.units;
  for (const Stage& g : steps.gather) issue(g, Phase::kForwardGather);
  for (int u = U - 1; u >= 0; --u) {
    // The head's gathered copy from forward is reused by its backward.
    if (!steps.gather.empty() && u != U - 1)
      issue(steps.gather[static_cast<size_t>(u)], Phase::kBackwardGather);
    for (const Stage& s : steps.reduction[static_cast<size_t>(u)]) issue(s, s.phase);
  }
  for (const Stage& n : steps.norm) issue(n, Phase::kGradNorm);
  for (const Stage& g : steps.optimizer_gather) issue(g, Phase::kOptimizerGather);
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
    account_node(c);
    c.seconds = 0;
    out.push_back(c);
  }
  return out;
}

double straggler_factor(int64_t ranks, const Effects& effects) {
  if (ranks < 2 || effects.jitter_1024 <= 0) return 1.0;
  // The slowest of n ranks arriving with independent Gaussian jitter is late
  // by about sigma·sqrt(2 ln n): scaled so that n = 1024 pays jitter_1024.
  return 1.0 + effects.jitter_1024 * std::sqrt(std::log(static_cast<double>(ranks)) /
                                               std::log(1024.0));
}

void time_collectives(std::vector<Collective>& list, const BandwidthTable& table,
                      const Effects& effects) {
  for (Collective& c : list) {
    const int64_t p0 = c.ranks_per_node(), p1 = c.group_nodes;
    const int64_t size = comm::bench_size_bytes(c.op, c.count, c.group_size, c.elem_bytes);
    const int64_t call_size = std::max<int64_t>(1, size / c.buckets);
    double t = table.seconds(c.op, call_size, p0, p1);
    if (c.switches > 1 && effects.oversubscription > 1) {
      // Crossing the spine: the bandwidth part slows by the oversubscription,
      // the latency floor (the table's smallest size) does not.
      const double floor = std::min(t, table.seconds(c.op, 1, p0, p1));
      t = floor + (t - floor) * effects.oversubscription;
    }
    c.seconds = static_cast<double>(c.calls * c.buckets) * t *
                straggler_factor(c.group_size, effects);
    if (effects.memory_bytes_per_s > 0)
      c.seconds += static_cast<double>(c.local_bytes) / effects.memory_bytes_per_s;
  }
}

namespace {

// A decoder layer's MLP block, forward, per micro-batch: gate, up and down.
double mlp_forward_flops(const Workload& w) {
  return 2.0 * 3 * static_cast<double>(w.model.hidden_size) *
         static_cast<double>(w.model.intermediate_size) *
         static_cast<double>(w.tokens_per_micro_batch());
}

}  // namespace

std::vector<double> unit_forward_flops(const Workload& w) {
  const model::LlamaConfig& c = w.model;
  const double h = static_cast<double>(c.hidden_size), kv = static_cast<double>(c.kv_dim()),
               V = static_cast<double>(c.vocab_size), T = static_cast<double>(w.seq_len),
               tokens = static_cast<double>(w.tokens_per_micro_batch());
  const double layer =
      (2.0 * (2 * h * h + 2 * kv * h) + 2.0 * h * T) * tokens + mlp_forward_flops(w);
  std::vector<double> flops;
  flops.push_back(0.0);  // the embedding is a lookup
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) flops.push_back(layer);
  flops.push_back(2.0 * V * h * tokens);
  return flops;
}

double optimizer_seconds(const Workload& w, const ShardPlan& plan, const Effects& effects) {
  if (effects.memory_bytes_per_s <= 0) return 0.0;
  // Per OS-shard element, AdamW reads the gradient, the master parameter, m
  // and v and writes the last three back, plus (bf16) the compute copy; the
  // gradient norm reads the gradient once more. bf16: 4·4 + 3·4 + 2 + 4 = 34
  // bytes; fp32: 4·4 + 3·4 + 4 = 32.
  const double bytes = w.precision == Precision::kBf16 ? 34.0 : 32.0;
  double elements = 0;
  for (int64_t n : unit_numels(w.model))
    elements += static_cast<double>(padded_numel(n, plan.os.size()) / plan.os.size());
  return elements * bytes / effects.memory_bytes_per_s;
}

namespace {

// One window: compute `comp` with collectives `comm` beside it on the one
// communication stream. Overlapped, compute runs 1/(1 + k) as fast while a
// collective runs (SMs and memory bandwidth taken by the communication
// kernels): the window lasts max(comm, comp + comm·k/(1 + k)). Without
// overlap the two run one after the other. Returns what exceeds `comp`.
double window_excess(double comm, double comp, const Schedule& schedule, const Effects& e) {
  if (!schedule.overlap) return comm;
  const double k = e.contention;
  return std::max(comm, comp + comm * k / (1.0 + k)) - comp;
}

}  // namespace

namespace {

// Seconds of forward and backward per unit and micro-batch (backward twice
// the forward; with full recomputation, each layer's forward once more), and
// a decoder layer's backward in its two parts (model/layout.h:
// backward_parts): the MLP block's (with the recomputation), then the
// attention block's.
struct UnitTimes {
  std::vector<double> forward, backward;
  std::vector<std::vector<double>> backward_parts;
  double executed_flops = 0;  // per micro-batch, recomputation included
};

UnitTimes unit_times(const Workload& w, const Compute& compute) {
  const std::vector<double> flops = unit_forward_flops(w);
  const size_t U = flops.size();
  const double mlp_flops = mlp_forward_flops(w);
  UnitTimes t;
  t.forward.resize(U);
  t.backward.resize(U);
  t.backward_parts.resize(U);
  for (size_t u = 0; u < U; ++u) {
    t.forward[u] = flops[u] / compute.flops_per_s;
    t.backward[u] = 2 * t.forward[u];
    t.executed_flops += 3 * flops[u];
    const bool decoder = u > 0 && u + 1 < U;
    if (w.recompute == Recompute::kFull && decoder) {
      t.backward[u] += t.forward[u];
      t.executed_flops += flops[u];
    }
    if (!decoder) continue;
    const double mlp = 2 * mlp_flops / compute.flops_per_s + (t.backward[u] - 2 * t.forward[u]);
    t.backward_parts[u] = {mlp, t.backward[u] - mlp};
  }
  return t;
}

// Communication seconds per unit and phase (one occurrence each); the last
// micro-batch's reductions per backward part they follow (one part unless
// the unit reduces in buckets: plan/schedule.h, Stage::part).
struct PhaseTimes {
  std::vector<double> fg, bg, br, og;  // forward gather .. optimizer gather
  std::vector<std::vector<double>> lr;
  double norm = 0;
};

// Sorts the timed collectives into PhaseTimes and adds their totals (time,
// bytes per rank and per node) to `s`.
PhaseTimes tally(const std::vector<Collective>& timed, size_t units, StepCost& s) {
  PhaseTimes p;
  for (std::vector<double>* v : {&p.fg, &p.bg, &p.br, &p.og}) v->assign(units, 0.0);
  p.lr.assign(units, {0.0});
  for (const Collective& c : timed) {
    const double t = c.seconds;
    s.comm_s += static_cast<double>(c.per_step) * t;
    (c.inter_node() ? s.sent_inter : s.sent_intra) += c.per_step * c.traffic.sent;
    (c.inter_node() ? s.received_inter : s.received_intra) += c.per_step * c.traffic.received;
    s.node.nic_sent += c.per_step * c.node.nic_sent;
    s.node.nic_received += c.per_step * c.node.nic_received;
    s.node.intra += c.per_step * c.node.intra;
    switch (c.phase) {
      case Phase::kForwardGather: p.fg[c.unit] += t; break;
      case Phase::kBackwardGather: p.bg[c.unit] += t; break;
      case Phase::kBackwardReduce: p.br[c.unit] += t; break;
      case Phase::kLastReduce: {
        std::vector<double>& lr = p.lr[c.unit];
        if (lr.size() <= static_cast<size_t>(c.part)) lr.resize(c.part + 1, 0.0);
        lr[c.part] += t;
        break;
      }
      case Phase::kGradNorm: p.norm += t; break;
      case Phase::kOptimizerGather: p.og[c.unit] += t; break;
    }
  }
  return p;
}

// Exposed communication of one micro-batch (the first carries the previous
// step's optimizer gathers, the last the once-a-step reductions). Each
// window is a stretch of compute and the collectives that run beside it on
// the one communication stream.
double exposed_micro_batch(const UnitTimes& c, const PhaseTimes& p, bool first, bool last,
                           const Schedule& schedule, const Effects& effects) {
  auto over = [&](double comm, double comp) { return window_excess(comm, comp, schedule, effects); };
  const int U = static_cast<int>(c.forward.size());
  double e = 0;
  // Forward: unit u+1's gathers run while unit u computes; unit 0's run
  // before anything (the previous step's optimizer gather feeds the first
  // micro-batch).
  e += over(p.fg[0] + (first ? p.og[0] : 0), 0);
  for (int u = 0; u < U; ++u) {
    const double comm = u + 1 < U ? p.fg[u + 1] + (first ? p.og[u + 1] : 0) : 0;
    e += over(comm, c.forward[u]);
  }
  // Backward, head first: each stretch of compute hides the reductions
  // issued when the one before finished (the chained stages start as their
  // predecessors complete, on the communicators, while compute goes on) and,
  // first in unit u, the gather of unit u-1. A stretch is a unit's backward,
  // or on the last micro-batch one part of a unit that reduces in buckets.
  double issued = 0;
  for (int u = U - 1; u >= 0; --u) {
    const size_t parts = last ? p.lr[u].size() : 1;
    if (parts > 1 && c.backward_parts[u].size() != parts)
      fail("cost: unit ", u, " reduces in ", parts, " buckets, its backward has ",
           c.backward_parts[u].size(), " parts");
    for (size_t k = 0; k < parts; ++k) {
      const double comm = issued + (k == 0 && u > 0 ? p.bg[u - 1] : 0);
      e += over(comm, parts > 1 ? c.backward_parts[u][k] : c.backward[u]);
      issued = (k + 1 == parts ? p.br[u] : 0) + (last ? p.lr[u][k] : 0);
    }
  }
  // Then the embedding's reductions and the norm, with nothing to hide behind.
  return e + issued + (last ? p.norm : 0);
}

}  // namespace

StepCost step_cost(const Workload& w, const std::vector<Collective>& timed, int64_t M,
                   const Compute& compute, const Schedule& schedule, const Effects& effects,
                   double optimizer_s) {
  const UnitTimes c = unit_times(w, compute);
  StepCost s;
  for (size_t u = 0; u < c.forward.size(); ++u)
    s.compute_s += static_cast<double>(M) * (c.forward[u] + c.backward[u]);
  const PhaseTimes p = tally(timed, c.forward.size(), s);
  auto exposed = [&](bool first, bool last) {
    return exposed_micro_batch(c, p, first, last, schedule, effects);
  };
  s.exposed_s = M == 1 ? exposed(true, true)
                       : exposed(true, false) + static_cast<double>(M - 2) * exposed(false, false) +
                             exposed(false, true);
  s.optimizer_s = optimizer_s;
  s.step_s = s.compute_s + s.exposed_s + s.optimizer_s;
  const double model_flops = model::Llama::flops_per_token(w.model, w.seq_len) *
                             static_cast<double>(w.tokens_per_micro_batch() * M);
  const double peak_time = s.step_s * compute.peak_flops_per_s;
  s.mfu = peak_time > 0 ? model_flops / peak_time : 0;
  s.hfu = peak_time > 0 ? static_cast<double>(M) * c.executed_flops / peak_time : 0;
  return s;
}

}  // namespace amsp::plan
