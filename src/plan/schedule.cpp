#include "plan/schedule.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"
#include "model/layout.h"
#include "plan/compression.h"

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

const char* buf_name(Buf b) {
  switch (b) {
    case Buf::kNone: return "-";
    case Buf::kFull: return "slot.full";
    case Buf::kSlotP: return "slot.p";
    case Buf::kSlotG: return "slot.g";
    case Buf::kSlotOS: return "slot.os";
    case Buf::kGShard: return "G-shard";
    case Buf::kGShardOS: return "G-shard[OS]";
    case Buf::kPShard: return "P-shard";
    case Buf::kPShardOS: return "P-shard[OS]";
    case Buf::kGathered: return "gathered";
    case Buf::kNorm: return "norm";
    case Buf::kQSend: return "records.send";
    case Buf::kQRecv: return "records.recv";
  }
  return "?";
}

namespace {

Stage make_stage(Phase phase, int unit, Op op, GroupKind group, int64_t count, DType dtype,
                 Buf send, Buf recv, Runs runs) {
  Stage s;
  s.phase = phase;
  s.unit = unit;
  s.op = op;
  s.group = group;
  s.count = count;
  s.dtype = dtype;
  s.send = send;
  s.recv = recv;
  s.runs = runs;
  return s;
}

// A unit's reduction chain: its gradient from the full gradient backward
// wrote (or the G-shard it added into) to the OS-shard, one stage per group
// it must be summed over. Each stage after the first is chained to the one
// before; the local work moves the gradient between the wire dtype and the
// fp32 G-shard.
std::vector<Stage> reduction_chain(int u, int64_t phi, int64_t p_ranks, int64_t g_ranks,
                                   int64_t os_ranks, int64_t replicas, DType wire) {
  const bool bf16 = wire == DType::kBF16, direct = p_ranks == 1 && g_ranks == 1;
  std::vector<Stage> c;
  auto add = [&](Phase phase, Op op, GroupKind group, int64_t count, Buf send, Buf recv,
                 Runs runs) -> Stage& {
    c.push_back(make_stage(phase, u, op, group, count, wire, send, recv, runs));
    c.back().chained = c.size() > 1;
    return c.back();
  };
  // Every micro-batch: the full gradient over P, then its P part over G; the
  // G part is added into the G-shard.
  if (p_ranks > 1)
    add(Phase::kBackwardReduce, Op::kReduceScatter, GroupKind::kP, phi / p_ranks, Buf::kFull,
        g_ranks > p_ranks ? Buf::kSlotP : Buf::kSlotG, Runs::kEveryMicroBatch);
  if (g_ranks > p_ranks)
    add(Phase::kBackwardReduce, Op::kReduceScatter, GroupKind::kG, phi / g_ranks,
        p_ranks > 1 ? Buf::kSlotP : Buf::kFull, Buf::kSlotG, Runs::kEveryMicroBatch);
  if (!direct) c.back().after = {LocalStep::kAdd, Buf::kSlotG, Buf::kGShard};
  // The last micro-batch: the G-shard over OS, then its OS part over the
  // replicas. In bf16 the fp32 G-shard travels as a bf16 copy in the slot.
  bool in_os_slot = false;
  if (os_ranks > g_ranks) {
    Stage& s = add(Phase::kLastReduce, Op::kReduceScatter, GroupKind::kOS, phi / os_ranks,
                   bf16 ? Buf::kSlotG : Buf::kGShard, Buf::kSlotOS, Runs::kLastMicroBatch);
    if (bf16) s.before = {LocalStep::kCopy, Buf::kGShard, Buf::kSlotG};
    in_os_slot = true;
  }
  if (replicas > 1) {
    const bool slot = in_os_slot || bf16;
    Stage& s = add(Phase::kLastReduce, Op::kAllReduce, GroupKind::kReplica, phi / os_ranks,
                   Buf::kNone, slot ? Buf::kSlotOS : Buf::kGShardOS, Runs::kLastMicroBatch);
    if (slot && !in_os_slot) s.before = {LocalStep::kCopy, Buf::kGShardOS, Buf::kSlotOS};
    in_os_slot = slot;
  }
  if (in_os_slot) c.back().after = {LocalStep::kCopy, Buf::kSlotOS, Buf::kGShardOS};
  return c;
}

// Elements of slot buffer b for a unit of phi elements (0: not a slot buffer).
int64_t slot_elems(Buf b, int64_t phi, int64_t p_ranks, int64_t g_ranks, int64_t os_ranks) {
  switch (b) {
    case Buf::kFull: return phi;
    case Buf::kSlotP:
      return phi / p_ranks;
    case Buf::kSlotG:
      return phi / g_ranks;
    case Buf::kSlotOS:
      return phi / os_ranks;
    default: return 0;
  }
}

SlotElems slot_sizes(const std::vector<std::vector<Stage>>& chains, int64_t largest,
                     int64_t p_ranks, int64_t g_ranks, int64_t os_ranks) {
  SlotElems e;
  auto use = [&](Buf b) {
    const int64_t n = slot_elems(b, largest, p_ranks, g_ranks, os_ranks);
    if (b == Buf::kFull) e.full = n;
    if (b == Buf::kSlotP) e.p = n;
    if (b == Buf::kSlotG) e.g = n;
    if (b == Buf::kSlotOS) e.os = n;
  };
  for (const auto& chain : chains)
    for (const Stage& s : chain)
      for (Buf b : {s.send, s.recv, s.before.src, s.before.dst, s.after.src, s.after.dst, s.and_then.src,
                    s.and_then.dst})
        use(b);
  return e;
}

}  // namespace

bool StepSchedule::reduces(int unit, bool last_micro) const {
  for (const Stage& s : reduction[static_cast<size_t>(unit)])
    if (last_micro || s.runs == Runs::kEveryMicroBatch) return true;
  return false;
}

namespace {

// What every compressed stage shares: its c values per rank travel as one
// record of int32 words per rank, from and into the records' buffers.
void move_records(Stage& st, const kernels::quant::Spec& spec) {
  st.compressed = true;
  st.quant = spec;
  st.values = st.count;
  st.count = kernels::quant::record_words(st.values, spec);
  st.dtype = DType::kI32;
  st.send = Buf::kQSend;
  st.recv = Buf::kQRecv;
}

// A P all-gather of c values per rank made a compressed one: each rank
// quantizes its P-shard into one record, the records are gathered as int32
// words, and each of the P group's records is dequantized into its part of
// the gathered unit.
void compress_gather(Stage& g, const kernels::quant::Spec& spec, int64_t p_ranks) {
  g.before = {LocalStep::kQuantize, Buf::kPShard, Buf::kQSend, 1};
  g.after = {LocalStep::kDequantize, Buf::kQRecv, Buf::kGathered, p_ranks};
  move_records(g, spec);
}

// A reduce-scatter over a group of n ranks made a compressed one (ZeRO++'s
// qgZ, in one hop): each rank quantizes its n chunks into n records, an
// all-to-all hands every rank the records of its own chunk, and it sums them in
// fp32, in rank order, into the stage's old receive buffer; the stage's old
// local step (the add into the G-shard, the copy to it) follows. A bf16 copy
// that fed the reduce-scatter is skipped: the fp32 G-shard is quantized itself.
void compress_reduce(Stage& st, const kernels::quant::Spec& spec, int64_t n) {
  st.op = Op::kAllToAll;
  const Buf src = st.before.kind == LocalStep::kCopy ? st.before.src : st.send;
  st.before = {LocalStep::kQuantize, src, Buf::kQSend, n};
  st.and_then = st.after;
  st.after = {LocalStep::kDequantizeSum, Buf::kQRecv, st.recv, n};
  move_records(st, spec);
}

// The reduce-scatters of a chain compressed where the option says, with each
// group's size and the nodes it spans (plan/shard_plan.h: Factor).
void compress_chain(std::vector<Stage>& chain, const Compression& c, const ShardPlan& plan, SlotElems& slot) {
  for (Stage& st : chain) {
    if (st.op != Op::kReduceScatter) continue;
    int64_t n = 0, nodes = 0;
    if (st.group == GroupKind::kP) n = plan.p.size(), nodes = plan.p.s1;
    if (st.group == GroupKind::kG) n = plan.g.size() / plan.p.size(), nodes = plan.g.s1 / plan.p.s1;
    if (st.group == GroupKind::kOS) n = plan.os.size() / plan.g.size(), nodes = plan.os.s1 / plan.g.s1;
    const auto spec = compression_spec(c, Compressed::kGrads, nodes);
    if (!spec || n < 2) continue;
    compress_reduce(st, *spec, n);
    slot.qsend = std::max(slot.qsend, n * st.count);
    slot.qrecv = std::max(slot.qrecv, n * st.count);
  }
}

// A unit whose last micro-batch sums its whole gradient with one all-reduce
// (P, G and OS groups of one rank: ddp) sums it in buckets instead, one a backward
// part, each issued as its part returns, over the range that part finalised:
// a decoder layer's MLP gradients then travel while its attention block
// computes. Sums are elementwise, so a range summed alone is summed as in the
// whole. Other chains start with a reduce-scatter, whose split would change
// which rank holds which part of the unit; they are left whole.
int bucket_reductions(std::vector<Stage>& chain, const model::UnitSpec& unit, int64_t phi) {
  const std::vector<model::BackwardPart> parts = model::backward_parts(unit);
  if (parts.size() < 2 || chain.size() != 1 || phi != unit.numel) return 1;
  const Stage whole = chain.front();
  if (whole.op != Op::kAllReduce || whole.compressed || whole.count != phi) return 1;
  chain.clear();
  for (size_t k = 0; k < parts.size(); ++k) {
    Stage b = whole;
    b.bucket = true;
    b.part = static_cast<int>(k);
    b.offset = parts[k].begin;
    b.count = parts[k].end - parts[k].begin;
    chain.push_back(b);
  }
  return static_cast<int>(parts.size());
}

}  // namespace

StepSchedule step_schedule(const Workload& w, const ShardPlan& plan, const MeshShape& shape) {
  const int64_t p_ranks = plan.p.size(), g_ranks = plan.g.size(), os_ranks = plan.os.size(),
                d = shape.world();
  StepSchedule s;
  s.wire = w.precision == Precision::kBf16 ? DType::kBF16 : DType::kF32;
  s.prefetch = w.prefetch;
  s.direct_gradients = p_ranks == 1 && g_ranks == 1;
  // A P group spans plan.p.s1 nodes (plan/shard_plan.h: Factor).
  const auto pspec = compression_spec(w.compression, Compressed::kParams, plan.p.s1);
  const std::vector<model::UnitSpec> layout = model::build_layout(w.model);
  for (const model::UnitSpec& unit : layout) s.padded.push_back(padded_numel(unit.numel, os_ranks));
  s.units = static_cast<int>(s.padded.size());
  int64_t largest = 0;
  for (int u = 0; u < s.units; ++u) {
    const int64_t phi = s.padded[static_cast<size_t>(u)];
    largest = std::max(largest, phi);
    if (p_ranks > 1) {
      s.gather.push_back(make_stage(Phase::kForwardGather, u, Op::kAllGather, GroupKind::kP,
                                    phi / p_ranks, s.wire, Buf::kPShard, Buf::kGathered,
                                    Runs::kEveryMicroBatch));
      if (pspec) {
        compress_gather(s.gather.back(), *pspec, p_ranks);
        s.gather_qsend = std::max(s.gather_qsend, s.gather.back().count);
        s.gather_qrecv = std::max(s.gather_qrecv, p_ranks * s.gather.back().count);
      }
    }
    s.reduction.push_back(
        reduction_chain(u, phi, p_ranks, g_ranks, os_ranks, d / os_ranks, s.wire));
    s.parts.push_back(bucket_reductions(s.reduction.back(), layout[static_cast<size_t>(u)], phi));
    if (os_ranks > p_ranks)
      s.optimizer_gather.push_back(make_stage(Phase::kOptimizerGather, u, Op::kAllGather,
                                              GroupKind::kGather, phi / os_ranks, s.wire,
                                              Buf::kPShardOS, Buf::kPShard, Runs::kOnce));
  }
  if (d > 1) {
    // The squared norm, summed in fp64 over one replica: every rank takes part
    // (ranks of other replicas contribute zero), so the group is the world.
    s.norm.push_back(make_stage(Phase::kGradNorm, -1, Op::kAllReduce, GroupKind::kReplica, 1,
                                DType::kF64, Buf::kNone, Buf::kNorm, Runs::kOnce));
  }
  SlotElems records;
  for (auto& chain : s.reduction) compress_chain(chain, w.compression, plan, records);
  s.slot = slot_sizes(s.reduction, largest, p_ranks, g_ranks, os_ranks);
  s.slot.qsend = records.qsend;
  s.slot.qrecv = records.qrecv;
  return s;
}

std::vector<const Stage*> stages_for(const StepSchedule& s, int unit, bool last_micro, int part) {
  std::vector<const Stage*> out;
  for (const Stage& st : s.reduction[static_cast<size_t>(unit)])
    if ((last_micro || st.runs == Runs::kEveryMicroBatch) &&
        (part == Action::kWhole || st.part == part))
      out.push_back(&st);
  return out;
}

std::vector<Action> step_program(const StepSchedule& s, int64_t M) {
  const int U = s.units;
  const int64_t per_micro = 2 * U - 1;
  // Gather positions: per micro-batch, forward units 0..U-1, then backward
  // U-2..0 (the head's backward reuses its forward copy).
  auto unit_at = [&](int64_t pos) {
    const int64_t i = pos % per_micro;
    return static_cast<int>(i < U ? i : 2 * (U - 1) - i);
  };
  const int64_t total = M * per_micro;
  std::vector<Action> out;
  int64_t issued = 0;
  // Before computing position pos, the gathers of the next `prefetch` are issued.
  auto gathers_upto = [&](int64_t n) {
    if (s.gather.empty()) return;
    for (n = std::min(n, total); issued < n; ++issued)
      out.push_back({Action::kGather, unit_at(issued), issued / per_micro, issued});
  };
  for (int64_t m = 0; m < M; ++m) {
    const int64_t base = m * per_micro;
    for (int u = 0; u < U; ++u) {
      gathers_upto(base + u + 1 + s.prefetch);
      out.push_back({Action::kForward, u, m, base + u});
    }
    for (int u = U - 1; u >= 0; --u) {
      const int64_t pos = u == U - 1 ? base + U - 1 : base + U + (U - 2 - u);
      gathers_upto(pos + 1 + s.prefetch);
      // A unit that reduces in buckets runs its last micro-batch's backward
      // in parts, each followed by its bucket's reduction.
      const bool last = m == M - 1;
      const int parts = last ? s.parts[static_cast<size_t>(u)] : 1;
      for (int k = 0; k < parts; ++k) {
        const int part = parts > 1 ? k : Action::kWhole;
        out.push_back({Action::kBackward, u, m, pos, part});
        if (s.reduces(u, last)) out.push_back({Action::kReduce, u, m, pos, part});
      }
    }
  }
  out.push_back({Action::kNorm, -1, M - 1, 0});
  for (int u = 0; u < U; ++u) out.push_back({Action::kUpdate, u, M - 1, 0});
  return out;
}

std::vector<Action> eval_program(const StepSchedule& s, int64_t batches) {
  std::vector<Action> out;
  const int U = s.units;
  const int64_t total = batches * U;
  int64_t issued = 0;
  for (int64_t pos = 0; pos < total; ++pos) {
    if (!s.gather.empty())
      for (; issued < std::min(total, pos + 1 + s.prefetch); ++issued)
        out.push_back({Action::kGather, static_cast<int>(issued % U), issued / U, issued});
    out.push_back({Action::kForward, static_cast<int>(pos % U), pos / U, pos});
  }
  return out;
}

namespace {
Issue issue_of(const Stage& s) {
  return {s.phase == Phase::kGradNorm ? "world" : group_name(s.group), s.op, s.count};
}
}  // namespace

std::vector<Issue> issue_sequence(const StepSchedule& s, int64_t M) {
  std::vector<Issue> out;
  for (const Action& a : step_program(s, M)) {
    switch (a.kind) {
      case Action::kGather: out.push_back(issue_of(s.gather[static_cast<size_t>(a.unit)])); break;
      case Action::kReduce:
        for (const Stage* st : stages_for(s, a.unit, a.micro == M - 1, a.part))
          out.push_back(issue_of(*st));
        break;
      case Action::kNorm:
        if (!s.norm.empty()) out.push_back(issue_of(s.norm.front()));
        break;
      case Action::kUpdate:
        if (!s.optimizer_gather.empty())
          out.push_back(issue_of(s.optimizer_gather[static_cast<size_t>(a.unit)]));
        break;
      default: break;
    }
  }
  return out;
}

std::string format_issue(const Issue& i) {
  return cat(i.group, " ", comm::op_name(i.op), " ", i.count);
}

namespace {

std::string local_text(const char* when, const LocalStep& l) {
  switch (l.kind) {
    case LocalStep::kNone: return "";
    case LocalStep::kAdd: return cat("; ", when, " ", buf_name(l.dst), " += ", buf_name(l.src));
    case LocalStep::kCopy: return cat("; ", when, " ", buf_name(l.dst), " = ", buf_name(l.src));
    case LocalStep::kQuantize:
      return cat("; ", when, " ", buf_name(l.dst), " = quantize(", buf_name(l.src), ")");
    case LocalStep::kDequantize:
      return cat("; ", when, " ", buf_name(l.dst), " = dequantize(", buf_name(l.src), ", ", l.records,
                 " records)");
    case LocalStep::kDequantizeSum:
      return cat("; ", when, " ", buf_name(l.dst), " = sum of dequantize(", buf_name(l.src), ", ",
                 l.records, " records)");
  }
  return "";
}

std::string stage_line(const Stage& s) {
  const char* runs = s.runs == Runs::kEveryMicroBatch ? "every micro-batch"
                     : s.runs == Runs::kLastMicroBatch ? "last micro-batch"
                                                       : "once";
  std::string io = s.op == Op::kAllReduce ? cat(buf_name(s.recv), " in place")
                                          : cat(buf_name(s.send), " -> ", buf_name(s.recv));
  if (s.bucket)
    io += cat(" [", s.offset, ", ", s.offset + s.count, ") after backward part ", s.part + 1);
  return cat(s.phase == Phase::kGradNorm ? "world" : group_name(s.group), " ",
             comm::op_name(s.op), " ", s.count, " ", dtype_name(s.dtype), ", ", io, ", ", runs,
             s.chained ? ", chained after the stage above" : "", local_text("before:", s.before),
             local_text("then:", s.after), local_text("then:", s.and_then));
}

}  // namespace

std::string format_schedule(const StepSchedule& s, int64_t M) {
  std::ostringstream out;
  out << "Schedule: " << s.units << " units, " << M << " micro-batch" << (M == 1 ? "" : "es")
      << ", wire " << dtype_name(s.wire) << ", prefetch " << s.prefetch
      << (s.direct_gradients ? ", backward adds into the G-shard" : "") << "\n";
  out << "Reduction slot (elements): full " << s.slot.full << ", p " << s.slot.p << ", g "
      << s.slot.g << ", os " << s.slot.os << "\n";
  for (int u = s.units - 1; u >= 0; --u) {
    const size_t k = static_cast<size_t>(u);
    out << "unit " << u << ":\n";
    if (!s.gather.empty()) out << "  " << stage_line(s.gather[k]) << "\n";
    for (const Stage& st : s.reduction[k]) out << "  " << stage_line(st) << "\n";
    if (!s.optimizer_gather.empty()) out << "  " << stage_line(s.optimizer_gather[k]) << "\n";
  }
  if (!s.norm.empty()) out << "step: " << stage_line(s.norm.front()) << "\n";
  out << "Issue order, the same on every rank:\n";
  int64_t i = 0;
  for (const Issue& x : issue_sequence(s, M)) out << "  " << ++i << ". " << format_issue(x) << "\n";
  return out.str();
}

}  // namespace amsp::plan
