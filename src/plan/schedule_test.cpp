#include "plan/schedule.h"
#include "plan/test_workload.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "plan/cost.h"
#include "plan/search.h"
#include "core/error.h"

namespace amsp::plan {
namespace {

using comm::Op;

using testing::odd_workload;

const MeshShape k2x2{/*ranks_per_node=*/2, /*nodes=*/2};

// A stage in brief: "group op count send>recv [chained] [before] [then]".
std::string brief(const Stage& s) {
  std::string t = cat(group_name(s.group), " ", comm::op_name(s.op), " ", s.count, " ",
                      buf_name(s.send), ">", buf_name(s.recv),
                      s.runs == Runs::kLastMicroBatch ? " last" : "", s.chained ? " chained" : "");
  auto local = [&](const char* when, const LocalStep& l) {
    if (l.kind != LocalStep::kNone)
      t += cat(" ", when, ":", buf_name(l.dst), l.kind == LocalStep::kAdd ? "+=" : "=", buf_name(l.src));
  };
  local("before", s.before);
  local("then", s.after);
  if (s.bucket) t += cat(" [", s.offset, ",", s.offset + s.count, ") part ", s.part);
  return t;
}

std::vector<std::string> chain(const char* plan, Precision precision, int unit) {
  const StepSchedule s = step_schedule(odd_workload(precision), parse_shard_plan(plan, k2x2), k2x2);
  std::vector<std::string> out;
  for (const Stage& st : s.reduction[static_cast<size_t>(unit)]) out.push_back(brief(st));
  return out;
}

// The head (unit 3) of the odd model: the final norm (6) and the output layer (7 x 6), 48
// elements, which every plan on 4 ranks splits evenly.
TEST(Schedule, ReductionChainsByHand) {
  using V = std::vector<std::string>;
  // zero1: backward adds into the whole G-shard; the last micro-batch scatters it
  // over OS (48 / 4 = 12), in bf16 through a bf16 copy in the slot.
  EXPECT_EQ(chain("zero1", Precision::kFp32, 3),
            (V{"OS reduce_scatter 12 G-shard>slot.os last then:G-shard[OS]=slot.os"}));
  EXPECT_EQ(chain("zero1", Precision::kBf16, 3),
            (V{"OS reduce_scatter 12 slot.g>slot.os last before:slot.g=G-shard then:G-shard[OS]=slot.os"}));
  // ddp: the replicas all-reduce the G-shard in place; bf16 through the slot.
  EXPECT_EQ(chain("ddp", Precision::kFp32, 3), (V{"replica all_reduce 48 ->G-shard[OS] last"}));
  EXPECT_EQ(chain("ddp", Precision::kBf16, 3),
            (V{"replica all_reduce 48 ->slot.os last before:slot.os=G-shard[OS] then:G-shard[OS]=slot.os"}));
  // A decoder layer (unit 1: 246 elements, post_attention_layernorm at 150)
  // in ddp: two buckets, its MLP block's gradients after that block's
  // backward, then its attention block's; zero1 scatters it whole.
  EXPECT_EQ(chain("ddp", Precision::kFp32, 1),
            (V{"replica all_reduce 96 ->G-shard[OS] last [150,246) part 0",
               "replica all_reduce 150 ->G-shard[OS] last [0,150) part 1"}));
  EXPECT_EQ(chain("ddp", Precision::kBf16, 1),
            (V{"replica all_reduce 96 ->slot.os last before:slot.os=G-shard[OS] "
               "then:G-shard[OS]=slot.os [150,246) part 0",
               "replica all_reduce 150 ->slot.os last before:slot.os=G-shard[OS] "
               "then:G-shard[OS]=slot.os [0,150) part 1"}));
  EXPECT_EQ(chain("zero1", Precision::kFp32, 1),
            (V{"OS reduce_scatter 62 G-shard>slot.os last then:G-shard[OS]=slot.os"}));
  // P then G, every micro-batch, the G part added into the G-shard; the G
  // reduce-scatter is chained after the P one.
  EXPECT_EQ(chain("p=2x1,g=2x2,os=2x2", Precision::kFp32, 3),
            (V{"P reduce_scatter 24 slot.full>slot.p", "G reduce_scatter 12 slot.p>slot.g chained then:G-shard+=slot.g"}));
  // mics:2: P (= G) every micro-batch, then the replicas, chained.
  EXPECT_EQ(chain("mics:2", Precision::kFp32, 3),
            (V{"P reduce_scatter 24 slot.full>slot.g then:G-shard+=slot.g",
               "replica all_reduce 24 ->G-shard[OS] last chained"}));
  // AMSP-style: G every micro-batch, then OS on the last, chained.
  EXPECT_EQ(chain("p=1x1,g=2x1,os=2x2", Precision::kBf16, 3),
            (V{"G reduce_scatter 24 slot.full>slot.g then:G-shard+=slot.g",
               "OS reduce_scatter 12 slot.g>slot.os last chained before:slot.g=G-shard then:G-shard[OS]=slot.os"}));
}

// The slots hold exactly the buffers the stages name, sized for the largest
// unit, and the memory model charges exactly those.
TEST(Schedule, SlotsAreTheBuffersTheStagesName) {
  for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
    const Workload w = odd_workload(precision);
    for (const ShardPlan& plan : enumerate_plans(k2x2)) {
      const StepSchedule s = step_schedule(w, plan, k2x2);
      std::map<Buf, bool> used;
      for (const auto& c : s.reduction)
        for (const Stage& st : c)
          for (Buf b : {st.send, st.recv, st.before.src, st.before.dst, st.after.src, st.after.dst})
            used[b] = true;
      const int64_t largest = *std::max_element(s.padded.begin(), s.padded.end());
      const std::string name = to_string(plan);
      EXPECT_EQ(s.slot.full, used[Buf::kFull] ? largest : 0) << name;
      EXPECT_EQ(s.slot.p, used[Buf::kSlotP] ? largest / plan.p.size() : 0) << name;
      EXPECT_EQ(s.slot.g, used[Buf::kSlotG] ? largest / plan.g.size() : 0) << name;
      EXPECT_EQ(s.slot.os, used[Buf::kSlotOS] ? largest / plan.os.size() : 0) << name;
      EXPECT_EQ(memory_per_rank(w, plan, 4).buckets,
                w.max_reductions * s.slot.total() * state_bytes(precision).p)
          << name;
    }
  }
}

// The program issues every collective the cost model prices, as often as it
// prices it, and nothing else.
TEST(Schedule, ProgramIssuesWhatTheCostModelPrices) {
  using Key = std::tuple<std::string, Op, int64_t>;
  for (const ShardPlan& plan : enumerate_plans(k2x2)) {
    for (int64_t M : {1, 3}) {
      const Workload w = odd_workload(Precision::kBf16);
      std::map<Key, int64_t> issued, priced;
      for (const Issue& i : issue_sequence(step_schedule(w, plan, k2x2), M))
        ++issued[{i.group, i.op, i.count}];
      for (const Collective& c : step_collectives(w, plan, k2x2, M))
        priced[{c.phase == Phase::kGradNorm ? "world" : group_name(c.group), c.op, c.count}] += c.per_step;
      EXPECT_EQ(issued, priced) << to_string(plan) << " M=" << M;
    }
  }
}

// Gathers run `prefetch` positions ahead of compute, a unit's reductions are
// issued right after its backward, the norm after every reduction, AdamW last.
TEST(Schedule, ProgramOrder) {
  Workload w = odd_workload(Precision::kFp32);
  for (int prefetch : {1, 2, 5}) {
    w.prefetch = prefetch;
    const StepSchedule s = step_schedule(w, parse_shard_plan("zero3", k2x2), k2x2);
    const int64_t M = 2, total = M * (2 * s.units - 1);
    const std::vector<Action> program = step_program(s, M);
    int64_t gathers = 0;
    for (size_t i = 0; i < program.size(); ++i) {
      const Action& a = program[i];
      if (a.kind == Action::kGather) {
        EXPECT_EQ(a.pos, gathers++);
      } else if (a.kind == Action::kForward || a.kind == Action::kBackward) {
        EXPECT_EQ(gathers, std::min(total, a.pos + 1 + prefetch)) << "prefetch " << prefetch;
        if (a.kind == Action::kBackward) {
          ASSERT_LT(i + 1, program.size());
          EXPECT_EQ(program[i + 1].kind, Action::kReduce);
          EXPECT_EQ(program[i + 1].unit, a.unit);
        }
      }
    }
    EXPECT_EQ(gathers, total);
    ASSERT_EQ(program.size(), static_cast<size_t>(total + 3 * M * s.units + 1 + s.units));
    EXPECT_EQ(program[program.size() - 1 - static_cast<size_t>(s.units)].kind, Action::kNorm);
    EXPECT_EQ(program.back().kind, Action::kUpdate);
  }
  // ddp gathers nothing and reduces only on the last micro-batch, where a
  // decoder layer's backward runs in two parts, each followed by its bucket.
  const StepSchedule ddp = step_schedule(w, parse_shard_plan("ddp", k2x2), k2x2);
  std::vector<std::string> last;
  for (const Action& a : step_program(ddp, 3)) {
    EXPECT_NE(a.kind, Action::kGather);
    if (a.kind == Action::kReduce) EXPECT_EQ(a.micro, 2);
    if (a.kind == Action::kBackward && a.micro < 2) EXPECT_EQ(a.part, Action::kWhole);
    if ((a.kind == Action::kBackward || a.kind == Action::kReduce) && a.micro == 2)
      last.push_back(cat(a.kind == Action::kBackward ? "B" : "R", a.unit,
                         a.part == Action::kWhole ? "" : cat(".", a.part)));
  }
  EXPECT_EQ(last, (std::vector<std::string>{"B3", "R3", "B2.0", "R2.0", "B2.1", "R2.1", "B1.0",
                                            "R1.0", "B1.1", "R1.1", "B0", "R0"}));
  // Nothing else splits.
  for (const ShardPlan& plan : enumerate_plans(k2x2))
    if (to_string(plan) != to_string(parse_shard_plan("ddp", k2x2)))
      EXPECT_EQ(step_schedule(w, plan, k2x2).parts, std::vector<int>(4, 1)) << to_string(plan);
}

TEST(Schedule, FormatNamesStagesAndTheIssueOrder) {
  const StepSchedule s = step_schedule(odd_workload(Precision::kBf16),
                                       parse_shard_plan("p=1x1,g=2x1,os=2x2", k2x2), k2x2);
  const std::string text = format_schedule(s, 2);
  EXPECT_NE(text.find("OS reduce_scatter 12 bf16, slot.g -> slot.os, last micro-batch, chained "
                      "after the stage above; before: slot.g = G-shard; then: G-shard[OS] = slot.os"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("Issue order, the same on every rank:\n  1. G reduce_scatter 24\n"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace amsp::plan

namespace amsp::plan {
namespace {

// Compressed P all-gathers (doc/compression.md): records of int32 words travel,
// quantized from the P-shard before and dequantized into the gathered unit
// after; the memory model counts the records' buffers; inter-node compresses
// only a P group that spans nodes.
TEST(Schedule, CompressedGathersMoveRecords) {
  Workload w = odd_workload(Precision::kFp32);
  w.compression = parse_compression("p=int8,block=16");
  const StepSchedule s = step_schedule(w, parse_shard_plan("zero3", k2x2), k2x2);
  const kernels::quant::Spec spec{8, 16};
  ASSERT_EQ(s.gather.size(), 4u);
  int64_t qsend = 0;
  for (const Stage& g : s.gather) {
    const int64_t phi = s.padded[static_cast<size_t>(g.unit)];
    EXPECT_TRUE(g.compressed);
    EXPECT_EQ(g.values, phi / 4);
    EXPECT_EQ(g.dtype, DType::kI32);
    EXPECT_EQ(g.count, kernels::quant::record_words(phi / 4, spec));
    EXPECT_EQ(g.send, Buf::kQSend);
    EXPECT_EQ(g.recv, Buf::kQRecv);
    EXPECT_EQ(g.before.kind, LocalStep::kQuantize);
    EXPECT_EQ(g.before.src, Buf::kPShard);
    EXPECT_EQ(g.after.kind, LocalStep::kDequantize);
    EXPECT_EQ(g.after.dst, Buf::kGathered);
    EXPECT_EQ(g.after.records, 4);
    qsend = std::max(qsend, g.count);
  }
  EXPECT_EQ(s.gather_qsend, qsend);
  EXPECT_EQ(s.gather_qrecv, 4 * qsend);
  // The memory model: the gathered units plus their records, per buffer.
  Workload plain = w;
  plain.compression = {};
  const MemoryBreakdown with = memory_per_rank(w, parse_shard_plan("zero3", k2x2), k2x2);
  const MemoryBreakdown without = memory_per_rank(plain, parse_shard_plan("zero3", k2x2), k2x2);
  EXPECT_EQ(with.gathered - without.gathered, (w.prefetch + 1) * 4 * 5 * qsend);
  // Gradients and the optimizer gathers are untouched.
  const StepSchedule p = step_schedule(plain, parse_shard_plan("zero3", k2x2), k2x2);
  for (int u = 0; u < s.units; ++u)
    for (size_t i = 0; i < s.reduction[static_cast<size_t>(u)].size(); ++i)
      EXPECT_EQ(brief(s.reduction[static_cast<size_t>(u)][i]), brief(p.reduction[static_cast<size_t>(u)][i]));
}

TEST(Schedule, InterNodeCompressesOnlyGroupsAcrossNodes) {
  Workload w = odd_workload(Precision::kBf16);
  w.compression = parse_compression("inter-node");
  // mics:2 on 2x2: P is the 2 ranks of a node; p=2x2 (zero3): the 4 ranks of 2 nodes.
  const StepSchedule local = step_schedule(w, parse_shard_plan("mics:2", k2x2), k2x2);
  for (const Stage& g : local.gather) EXPECT_FALSE(g.compressed);
  EXPECT_EQ(local.gather_qsend, 0);
  const StepSchedule across = step_schedule(w, parse_shard_plan("zero3", k2x2), k2x2);
  for (const Stage& g : across.gather) EXPECT_TRUE(g.compressed);
  // The issue order names the records' words.
  const std::vector<Issue> issues = issue_sequence(across, 1);
  EXPECT_EQ(issues.front(), (Issue{"P", Op::kAllGather, across.gather.front().count}));
}

}  // namespace
}  // namespace amsp::plan

namespace amsp::plan {
namespace {

// Compressed reduce-scatters (doc/compression.md): an all-to-all of one record per
// rank of the group, quantized from what the reduce-scatter sent (the fp32 G-shard,
// not its bf16 copy), summed into what it received, then its old local step. The
// replicas' all-reduce stays as it was; the records' buffers are the slot's.
TEST(Schedule, CompressedReductionsByHand) {
  using V = std::vector<std::string>;
  auto compressed_chain = [](const char* plan, Precision precision, const char* compress) {
    Workload w = odd_workload(precision);
    w.compression = parse_compression(compress);
    const StepSchedule s = step_schedule(w, parse_shard_plan(plan, k2x2), k2x2);
    std::vector<std::string> out;
    for (const Stage& st : s.reduction[3]) {
      std::string t = brief(st);
      if (st.compressed) t += cat(" values ", st.values, " records ", st.before.records, "/", st.after.records);
      if (st.and_then.kind != LocalStep::kNone)
        t += cat(" and:", buf_name(st.and_then.dst), st.and_then.kind == LocalStep::kAdd ? "+=" : "=",
                 buf_name(st.and_then.src));
      out.push_back(t);
    }
    return std::make_pair(out, s.slot);
  };
  const kernels::quant::Spec s8{8, 256};
  const int64_t w24 = kernels::quant::record_words(24, s8), w12 = kernels::quant::record_words(12, s8);
  // P then G, both compressed: records of 24 values over P (2 ranks), of 12 over G.
  auto [pg, pg_slot] = compressed_chain("p=2x1,g=2x2,os=2x2", Precision::kFp32, "g=int8");
  EXPECT_EQ(pg, (V{cat("P all_to_all ", w24, " records.send>records.recv before:records.send=slot.full "
                       "then:slot.p=records.recv values 24 records 2/2"),
                   cat("G all_to_all ", w12, " records.send>records.recv chained before:records.send=slot.p "
                       "then:slot.g=records.recv values 12 records 2/2 and:G-shard+=slot.g")}));
  // The slot's records are sized for the largest unit (a layer, 246 values padded to
  // 248): its P stage's 2 records of 124.
  EXPECT_EQ(pg_slot.qsend, 2 * kernels::quant::record_words(124, s8));
  EXPECT_EQ(pg_slot.qrecv, 2 * kernels::quant::record_words(124, s8));
  // AMSP-style in bf16: the OS stage quantizes the fp32 G-shard itself; slot.g, the
  // bf16 copy it no longer needs, is still the G stage's.
  auto [os, os_slot] = compressed_chain("p=1x1,g=2x1,os=2x2", Precision::kBf16, "g=int8");
  EXPECT_EQ(os, (V{cat("G all_to_all ", w24, " records.send>records.recv before:records.send=slot.full "
                       "then:slot.g=records.recv values 24 records 2/2 and:G-shard+=slot.g"),
                   cat("OS all_to_all ", w12, " records.send>records.recv last chained "
                       "before:records.send=G-shard then:slot.os=records.recv values 12 records 2/2 "
                       "and:G-shard[OS]=slot.os")}));
  // The replicas' all-reduce is not compressed; inter-node leaves a node's groups alone.
  auto [mics, mics_slot] = compressed_chain("mics:2", Precision::kFp32, "g=int8");
  EXPECT_EQ(mics.back(), "replica all_reduce 24 ->G-shard[OS] last chained");
  auto [local, local_slot] = compressed_chain("mics:2", Precision::kFp32, "inter-node");
  EXPECT_EQ(local.front(), "P reduce_scatter 24 slot.full>slot.g then:G-shard+=slot.g");
  EXPECT_EQ(local_slot.qsend, 0);
}

}  // namespace
}  // namespace amsp::plan
