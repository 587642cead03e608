#include "plan/cost.h"
#include "plan/test_workload.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/llama.h"

namespace amsp::plan {
namespace {

// Units 42, 246, 246, 48 (see memory_test.cpp); padded to 4: 44, 248, 248, 48
// (147 elements per rank over 4); to 2: 42, 246, 246, 48 (291 per rank over 2).
using testing::odd_workload;

const MeshShape k2x2{/*ranks_per_node=*/2, /*nodes=*/2};

struct Bytes {
  int64_t intra = 0, inter = 0;
};

Bytes sent(const std::vector<Collective>& list) {
  Bytes b;
  for (const Collective& c : list) (c.inter_node() ? b.inter : b.intra) += c.per_step * c.traffic.sent;
  return b;
}

Bytes sent_for(const std::string& plan, int64_t M = 2) {
  return sent(step_collectives(odd_workload(), parse_shard_plan(plan, k2x2), k2x2, M));
}

// Every named plan on 2 ranks x 2 nodes, 2 micro-batches, bf16: parameters
// and gradients travel as 2-byte bf16 (the G-shard accumulates in fp32, but
// what a reduction sends is bf16). Group of n: all-gather / reduce-scatter send (n-1)·c·2,
// all-reduce 2(n-1)·ceil(c/n)·2; the gradient norm is an fp64 all-reduce of
// one element over 4 ranks: 2·3·1·8 = 48, inter-node.
TEST(Cost, BytesOfNamedPlansByHand) {
  // ddp: replica all-reduce of whole units over 4: 12·ceil(Φ/4) with
  // ceil = 11, 62, 62, 12: 1764; + norm.
  EXPECT_EQ(sent_for("ddp").inter, 1764 + 48);
  EXPECT_EQ(sent_for("ddp").intra, 0);
  // zero1: OS reduce-scatter of 147 per rank over 4: 6·147 = 882; optimizer
  // all-gather over the gather group (4): 882; + norm.
  EXPECT_EQ(sent_for("zero1").inter, 882 + 48 + 882);
  EXPECT_EQ(sent_for("zero1").intra, 0);
  // zero2: G reduce-scatter every micro-batch: 2·882; optimizer gather 882.
  EXPECT_EQ(sent_for("zero2").inter, 2 * 882 + 48 + 882);
  // zero3 (= fsdp = mics:4 here): forward gather 2·882, backward gather
  // without the head 2·6·(11 + 62 + 62) = 2·810, reduce-scatter 2·882.
  EXPECT_EQ(sent_for("zero3").inter, 2 * 882 + 2 * 810 + 2 * 882 + 48);
  EXPECT_EQ(sent_for("zero3").intra, 0);
  EXPECT_EQ(sent_for("fsdp").inter, sent_for("zero3").inter);
  EXPECT_EQ(sent_for("mics:4").inter, sent_for("zero3").inter);
  // mics:2 (2x1): P group inside the node, 1·c·2 with c = 21, 123, 123, 24:
  // forward 2·582, backward gather 2·534, reduce-scatter 2·582; replica
  // all-reduce over the 2 nodes of c = 21, 123, 123, 24: 4·ceil(c/2) = 4·147.
  EXPECT_EQ(sent_for("mics:2").intra, 2 * 582 + 2 * 534 + 2 * 582);
  EXPECT_EQ(sent_for("mics:2").inter, 4 * 147 + 48);
  // AMSP-style: p=1, g=2x1 (node), os=2x2. G reduce-scatter inside the node
  // of 22, 124, 124, 24 per rank: 2·294 per micro-batch; OS reduce-scatter
  // over 2 nodes of 147: 2·147; gather group of 4: 6·147.
  EXPECT_EQ(sent_for("p=1x1,g=2x1,os=2x2").intra, 2 * 588);
  EXPECT_EQ(sent_for("p=1x1,g=2x1,os=2x2").inter, 294 + 48 + 882);
}

TEST(Cost, ScheduleShape) {
  const Workload w = odd_workload();
  // zero3 with 3 micro-batches: 4 forward gathers, 3 backward gathers (not
  // the head), 4 reduce-scatters, each 3 times a step; the norm once.
  const auto list = step_collectives(w, parse_shard_plan("zero3", k2x2), k2x2, 3);
  int fg = 0, bg = 0, br = 0, other = 0;
  for (const Collective& c : list) {
    if (c.phase == Phase::kForwardGather) ++fg;
    else if (c.phase == Phase::kBackwardGather) { ++bg; EXPECT_NE(c.unit, 3); }
    else if (c.phase == Phase::kBackwardReduce) ++br;
    else if (c.phase == Phase::kGradNorm) { EXPECT_EQ(c.elem_bytes, 8); EXPECT_EQ(c.per_step, 1); }
    else ++other;
    if (c.phase != Phase::kGradNorm) EXPECT_EQ(c.per_step, 3);
    // bf16 on the wire, gradients included, whatever the accumulator's dtype.
    if (c.phase != Phase::kGradNorm) EXPECT_EQ(c.elem_bytes, 2);
  }
  EXPECT_EQ(fg, 4);
  EXPECT_EQ(bg, 3);
  EXPECT_EQ(br, 4);
  EXPECT_EQ(other, 0);
}

TEST(Cost, NoCommunicationOfAKindIsChargedNone) {
  const Workload w = odd_workload();
  // ddp gathers nothing and reduce-scatters nothing.
  for (const Collective& c : step_collectives(w, parse_shard_plan("ddp", k2x2), k2x2, 2))
    EXPECT_EQ(c.op, comm::Op::kAllReduce);
  // On one node nothing is inter-node, for every plan.
  const MeshShape one_node{4, 1};
  for (const char* plan : {"ddp", "zero1", "zero2", "zero3", "mics:2", "p=1,g=2,os=4"})
    EXPECT_EQ(sent(step_collectives(w, parse_shard_plan(plan, one_node), one_node, 2)).inter, 0)
        << plan;
  // One rank: no collectives at all.
  EXPECT_TRUE(step_collectives(w, parse_shard_plan("zero3", MeshShape{1, 1}), MeshShape{1, 1}, 2).empty());
  // fp32 doubles every payload but the norm: bf16 sends 2 bytes per element
  // in every collective (the 4-byte gradient accumulator never travels).
  Workload w32 = w;
  w32.precision = Precision::kFp32;
  for (const char* plan : {"ddp", "zero1", "zero2", "zero3", "mics:2", "p=1x1,g=2x1,os=2x2"}) {
    const Bytes b32 = sent(step_collectives(w32, parse_shard_plan(plan, k2x2), k2x2, 2));
    EXPECT_EQ(b32.inter - 48, 2 * (sent_for(plan).inter - 48)) << plan;
    EXPECT_EQ(b32.intra, 2 * sent_for(plan).intra) << plan;
  }
}

TEST(Cost, PaperFormulationByHand) {
  // zero2 on 2x2: G reduce-scatter of 147 per rank over 4 becomes an
  // all-reduce of 588 (2·3·147·2 = 1764 per micro-batch); the optimizer
  // gather becomes 4 broadcasts of 147: each rank roots one (sends 294) and
  // receives three (882).
  const auto amsp = step_collectives(odd_workload(), parse_shard_plan("zero2", k2x2), k2x2, 2);
  const auto paper = paper_formulation(amsp);
  ASSERT_EQ(paper.size(), amsp.size());
  int64_t sent_bytes = 0, received = 0;
  for (const Collective& c : paper) {
    EXPECT_NE(c.op, comm::Op::kReduceScatter);
    EXPECT_NE(c.op, comm::Op::kAllGather);
    sent_bytes += c.per_step * c.traffic.sent;
    received += c.per_step * c.traffic.received;
  }
  EXPECT_EQ(sent_bytes, 2 * 2 * 882 + 48 + 294);
  EXPECT_EQ(received, 2 * 2 * 882 + 48 + 882);
}

TEST(Cost, MicroBatchesNameTheOption) {
  const Workload w = odd_workload();  // 4 tokens per micro-batch
  EXPECT_EQ(micro_batches_per_step(64, w, 4), 4);
  for (int64_t bad : {8, 60, 0}) {
    try {
      micro_batches_per_step(bad, w, 4);
      ADD_FAILURE() << bad;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--global-batch"), std::string::npos);
    }
  }
}

TEST(Cost, UnitFlopsAddUpToTheModelFigure) {
  for (const char* name : {"tiny", "llama-7b", "llama2-70b"}) {
    Workload w;
    w.model = model::load_config(name);
    w.seq_len = 512;
    w.micro_batch = 2;
    double sum = 0;
    for (double f : unit_forward_flops(w)) sum += f;
    const double per_token = 3 * sum / static_cast<double>(w.tokens_per_micro_batch());
    EXPECT_NEAR(per_token / model::Llama::flops_per_token(w.model, 512), 1.0, 1e-12) << name;
  }
}

// One forward gather per unit of the 4-unit model, each taking `seconds`.
std::vector<Collective> forward_gathers(double seconds) {
  std::vector<Collective> list;
  for (int u = 0; u < 4; ++u) {
    Collective c;
    c.phase = Phase::kForwardGather;
    c.unit = u;
    c.seconds = seconds;
    list.push_back(c);
  }
  return list;
}

// Overlap by hand: only forward gathers of 1 s each on a 4-unit model whose
// decoder layers take 0.25 s forward and whose embedding and head take (close
// to) nothing. Unit 0's gather and unit 1's (behind the embedding) are fully
// exposed; units 2 and 3 hide 0.25 s each behind layers 0 and 1.
TEST(Cost, OverlapByHand) {
  Workload w = odd_workload();
  const std::vector<double> flops = unit_forward_flops(w);
  Compute compute;
  compute.flops_per_s = flops[1] / 0.25;
  compute.peak_flops_per_s = compute.flops_per_s;
  std::vector<Collective> list = forward_gathers(1.0);
  const double head_fwd = flops[3] / compute.flops_per_s;
  const StepCost s = step_cost(w, list, 1, compute);
  EXPECT_NEAR(s.exposed_s, 1 + 1 + 0.75 + std::max(0.0, 1 - 0.25), 1e-12);
  EXPECT_NEAR(s.compute_s, 3 * (0.25 + 0.25 + head_fwd), 1e-12);
  EXPECT_NEAR(s.step_s, s.compute_s + s.exposed_s, 1e-12);
  EXPECT_NEAR(s.comm_s, 4.0, 1e-12);
  // Recomputation adds one forward of each layer to backward.
  w.recompute = Recompute::kFull;
  EXPECT_NEAR(step_cost(w, list, 1, compute).compute_s, s.compute_s + 2 * 0.25, 1e-12);
  // With two micro-batches everything happens twice.
  for (auto& c : list) c.per_step = 2;
  w.recompute = Recompute::kNone;
  EXPECT_NEAR(step_cost(w, list, 2, compute).exposed_s, 2 * s.exposed_s, 1e-12);
}

NodeBytes node_bytes(const std::string& plan, int64_t M = 1) {
  NodeBytes b;
  for (const Collective& c : step_collectives(odd_workload(), parse_shard_plan(plan, k2x2), k2x2, M)) {
    b.nic_sent += c.per_step * c.node.nic_sent;
    b.nic_received += c.per_step * c.node.nic_received;
    b.intra += c.per_step * c.node.intra;
  }
  return b;
}

// A node's bytes by hand, 2 ranks x 2 nodes, bf16 (2 bytes), one micro-batch.
// Padded to 4 the units hold 147 elements per rank; to 2, 291.
TEST(Cost, NodeBytesByHand) {
  // zero1: the OS reduce-scatter and the optimizer all-gather over the world
  // (2 per node x 2 nodes): each node's NICs carry the other node's 2·147
  // elements, in and out: 588 bytes each; the fp64 norm 2·(2-1)/2·8 = 8.
  // The node's ranks send 2·3·147·2 = 1764 per collective, 588 of it out.
  const NodeBytes z1 = node_bytes("zero1");
  EXPECT_EQ(z1.nic_sent, 588 + 588 + 8);
  EXPECT_EQ(z1.nic_received, z1.nic_sent);
  EXPECT_EQ(z1.intra, 2 * (1764 - 588) + (2 * 48 - 8));
  // mics:2: P, G and OS inside the node (no NIC bytes); the replica
  // all-reduce over the two nodes runs as 2 groups of 1 rank per node, each
  // 2·(2-1)/2 of its 291·2 bytes: 2·582 = 1164; + the norm.
  const NodeBytes m2 = node_bytes("mics:2");
  EXPECT_EQ(m2.nic_sent, 1164 + 8);
  // ddp all-reduces whole units, unpadded (582 elements, 1164 bytes): each
  // node's NICs carry 2·(2-1)/2 of them, as many as zero1's reduce-scatter
  // and all-gather together less the padding.
  EXPECT_EQ(node_bytes("ddp").nic_sent, 1164 + 8);
  // Per micro-batch collectives count M times.
  EXPECT_EQ(node_bytes("zero2", 3).nic_sent - node_bytes("zero2", 1).nic_sent, 2 * 588);
}

// Collectives that share the GPU slow compute: with contention k, a window of
// compute c and communication m lasts max(m, c + m·k/(1 + k)); without
// overlap, c + m. OverlapByHand's model with 0.1 s gathers.
TEST(Cost, ContentionAndNoOverlapByHand) {
  Workload w = odd_workload();
  const std::vector<double> flops = unit_forward_flops(w);
  Compute compute;
  compute.flops_per_s = flops[1] / 0.25;
  compute.peak_flops_per_s = compute.flops_per_s;
  const std::vector<Collective> list = forward_gathers(0.1);
  const double embed = flops[0] / compute.flops_per_s;  // 0: a lookup
  ASSERT_EQ(embed, 0.0);
  // Unit 0's gather and unit 1's (behind the embedding) are exposed; units 2
  // and 3 hide behind the layers.
  EXPECT_NEAR(step_cost(w, list, 1, compute).exposed_s, 0.2, 1e-12);
  Effects effects;
  effects.contention = 1.0;  // half speed beside a collective: each layer loses 0.05 s
  EXPECT_NEAR(step_cost(w, list, 1, compute, {}, effects).exposed_s, 0.2 + 2 * 0.05, 1e-12);
  Schedule serial;
  serial.overlap = false;
  EXPECT_NEAR(step_cost(w, list, 1, compute, serial, effects).exposed_s, 0.4, 1e-12);
}

// A unit's later reduction stages are chained on the communicators: they run
// beside the backward of the units after it, exactly like first stages.
TEST(Cost, ChainedReductionStagesHideBehindBackward) {
  const Workload w = odd_workload();
  auto list = step_collectives(w, parse_shard_plan("p=2x1,g=2x1,os=2x2", k2x2), k2x2, 1);
  int first = 0, later = 0;
  for (Collective& c : list) {
    c.seconds = 1e-3;
    if (c.op != comm::Op::kReduceScatter) continue;
    (c.chained ? later : first) += 1;
    EXPECT_EQ(c.chained, c.group == GroupKind::kOS) << phase_name(c.phase) << " unit " << c.unit;
  }
  EXPECT_EQ(first, 4);  // the P reduce-scatter of each unit
  EXPECT_EQ(later, 4);  // then its OS reduce-scatter
  Compute slow;  // compute long enough to hide everything that can hide
  slow.flops_per_s = 1e3;
  slow.peak_flops_per_s = 1e3;
  const double exposed = step_cost(w, list, 1, slow).exposed_s;
  for (Collective& c : list) c.chained = false;
  EXPECT_EQ(step_cost(w, list, 1, slow).exposed_s, exposed);
  // What stays exposed: the reductions of unit 0 (after the last backward)
  // and unit 1 (behind the embedding's backward, which takes no time); the
  // forward and optimizer gathers of unit 0 (before anything) and unit 1
  // (behind the embedding's forward); the norm.
  double expected = 0;
  for (const Collective& c : list) {
    const bool reduce = c.phase == Phase::kBackwardReduce || c.phase == Phase::kLastReduce;
    const bool gather = c.phase == Phase::kForwardGather || c.phase == Phase::kOptimizerGather;
    if (((reduce || gather) && c.unit <= 1) || c.phase == Phase::kGradNorm) expected += c.seconds;
  }
  EXPECT_NEAR(expected, 9e-3, 1e-12);
  EXPECT_NEAR(exposed, expected, 1e-12);
  // zero1: the OS reduce-scatter is the first stage.
  for (const Collective& c : step_collectives(w, parse_shard_plan("zero1", k2x2), k2x2, 1))
    EXPECT_FALSE(c.chained);
}

// ddp's buckets by hand, one micro-batch: a decoder layer's backward takes
// 1 s, its MLP block's part 1440/4128 of it (6·h·I = 720 of the layer's 2064
// forward FLOPs, h 6, I 5, 4 tokens); the head's all-reduce 0.2 s, every other
// collective 0.5 s. Backward runs head, layer 2 (MLP, attention), layer 1
// (MLP, attention), embedding (no time). The head's all-reduce hides behind
// layer 2's MLP block, layer 2's MLP bucket behind its attention block, its
// attention bucket behind layer 1's MLP block (0.5 - 0.349 s exposed), layer
// 1's MLP bucket behind its attention block; layer 1's attention bucket, the
// embedding's all-reduce and the norm are exposed. Unsplit, layer 2's whole
// all-reduce hid behind layer 1, and layer 1's was exposed.
TEST(Cost, DdpBucketsHideBehindTheRestOfTheLayer) {
  const Workload w = odd_workload();
  auto list = step_collectives(w, parse_shard_plan("ddp", k2x2), k2x2, 1);
  ASSERT_EQ(list.size(), 7u);  // head, 2 x 2 buckets, embedding, norm
  for (Collective& c : list) c.seconds = c.unit == 3 ? 0.2 : 0.5;
  Compute compute;
  compute.flops_per_s = 2 * unit_forward_flops(w)[1];  // a layer's backward: 1 s
  compute.peak_flops_per_s = compute.flops_per_s;
  const double mlp = 1440.0 / 4128.0;
  ASSERT_NEAR(unit_forward_flops(w)[1], 2064.0, 1e-9);
  EXPECT_NEAR(step_cost(w, list, 1, compute).exposed_s, (0.5 - mlp) + 3 * 0.5, 1e-12);
  // Recomputation runs the layer's forward (0.5 s) in its first part, which
  // then hides the 0.5 s before it: only the tail is exposed.
  Workload r = w;
  r.recompute = Recompute::kFull;
  EXPECT_NEAR(step_cost(r, list, 1, compute).exposed_s, 3 * 0.5, 1e-12);
  // Merged back into one all-reduce a layer (every part 0): layer 2's hides
  // behind layer 1, and layer 1's 1 s is exposed with the embedding's and the norm.
  for (Collective& c : list) c.part = 0;
  EXPECT_NEAR(step_cost(w, list, 1, compute).exposed_s, 1.0 + 0.5 + 0.5, 1e-12);
}

TEST(Cost, OptimizerStreamsTheOsShard) {
  Workload w = odd_workload();
  Effects effects;
  EXPECT_EQ(optimizer_seconds(w, parse_shard_plan("zero1", k2x2), effects), 0.0);  // not modelled
  effects.memory_bytes_per_s = 1000;
  // bf16: 34 bytes per element; zero1 over 4 ranks: 147 elements.
  EXPECT_NEAR(optimizer_seconds(w, parse_shard_plan("zero1", k2x2), effects), 147 * 34 / 1000.0, 1e-12);
  // ddp: every (unpadded) element, 582.
  EXPECT_NEAR(optimizer_seconds(w, parse_shard_plan("ddp", k2x2), effects), 582 * 34 / 1000.0, 1e-12);
  w.precision = Precision::kFp32;
  EXPECT_NEAR(optimizer_seconds(w, parse_shard_plan("ddp", k2x2), effects), 582 * 32 / 1000.0, 1e-12);
}

// Stragglers, the spine and buckets, on LLaMA-7B over 32 nodes of 8 with 16
// nodes per leaf switch.
TEST(Cost, StragglersSpineAndBuckets) {
  Effects effects;
  effects.jitter_1024 = 0.03;
  EXPECT_NEAR(straggler_factor(1024, effects), 1.03, 1e-12);
  EXPECT_NEAR(straggler_factor(2, effects), 1 + 0.03 * std::sqrt(std::log(2.0) / std::log(1024.0)), 1e-12);
  EXPECT_EQ(straggler_factor(1, effects), 1.0);

  Workload w;
  w.model = model::load_config("llama-7b");
  w.seq_len = 4096;
  const MeshShape mesh{8, 32};
  const BandwidthTable table = load_cluster("a800", "cluster").bandwidth;
  auto gather_seconds = [&](const char* plan, const Effects& e, const Schedule& schedule) {
    auto list = step_collectives(w, parse_shard_plan(plan, mesh), mesh, 1, schedule, 16);
    time_collectives(list, table, e);
    for (const Collective& c : list)
      if (c.phase == Phase::kForwardGather && c.unit == 1) return std::make_pair(c.switches, c.seconds);
    return std::make_pair(int64_t{0}, 0.0);
  };
  Effects spine;
  spine.oversubscription = 2;
  // zero3's P group spans all 32 nodes, two leaves: it pays the spine.
  const auto [sw3, t3] = gather_seconds("zero3", {}, {});
  EXPECT_EQ(sw3, 2);
  EXPECT_GT(gather_seconds("zero3", spine, {}).second, 1.9 * t3);
  // mics:128 keeps each group under one leaf (16 nodes): no spine.
  const auto [sw128, t128] = gather_seconds("mics:128", {}, {});
  EXPECT_EQ(sw128, 1);
  EXPECT_EQ(gather_seconds("mics:128", spine, {}).second, t128);
  // Buckets of a tenth of a layer: ten calls of a tenth of the size, each
  // paying the ring's latency once more.
  Schedule buckets;
  buckets.gather_bucket = 20'238'336;  // a 7B layer is 202,383,360 elements
  const double t_buckets = gather_seconds("zero3", {}, buckets).second;
  const int64_t layer_bytes = 202'383'360 * 2;
  EXPECT_NEAR(t_buckets, 10 * table.seconds(comm::Op::kAllGather, layer_bytes / 10, 8, 32), 1e-12);
  EXPECT_GT(t_buckets, t3 + 9 * table.seconds(comm::Op::kAllGather, 1, 8, 32));
}

}  // namespace
}  // namespace amsp::plan

namespace amsp::plan {
namespace {

// A compressed stage's quantize and dequantize steps are priced at the memory
// bandwidth (doc/compression.md, "Priced"): zero3 over 4 ranks, p=int8 and g=int8
// in blocks of 16, fp32. The embedding's P all-gather (44 values, 11 a rank):
// quantizing reads 11 values and writes one record of 1 scale + 11 codes padded
// to 16 bytes (4 words); dequantizing reads the 4 records and writes 44 values.
TEST(Cost, CompressedStagesPayForTheirKernels) {
  Workload w = odd_workload(Precision::kFp32);
  w.compression = parse_compression("p=int8,g=int8,block=16");
  const ShardPlan plan = parse_shard_plan("zero3", k2x2);
  std::vector<Collective> list = step_collectives(w, plan, k2x2, 1);
  const Collective& gather = list.front();
  ASSERT_EQ(gather.phase, Phase::kForwardGather);
  ASSERT_EQ(gather.unit, 0);
  EXPECT_EQ(gather.count, 4);
  EXPECT_EQ(gather.local_bytes, (11 * 4 + 16) + 4 * (16 + 11 * 4));
  // A reduction: an all-to-all of 4 records of 11 values each (the unit's 44
  // split over the 4 ranks), quantized from 4 x 11 values; the 4 received
  // records summed into 11 values read and written; the add into the G-shard.
  const auto reduce = std::find_if(list.begin(), list.end(), [](const Collective& c) {
    return c.unit == 0 && c.op == comm::Op::kAllToAll;
  });
  ASSERT_NE(reduce, list.end());
  EXPECT_EQ(reduce->local_bytes, 4 * (11 * 4 + 16) + (4 * 16 + 2 * 11 * 4) + 3 * 11 * 4);
  // Uncompressed stages move nothing locally; the time is the table's plus the bytes at
  // the memory bandwidth.
  Workload plain = w;
  plain.compression = {};
  for (const Collective& c : step_collectives(plain, plan, k2x2, 1)) EXPECT_EQ(c.local_bytes, 0);
  const BandwidthTable table = load_cluster("a800", "cluster").bandwidth;
  Effects effects;
  std::vector<Collective> untimed = list;
  time_collectives(list, table, effects);
  effects.memory_bytes_per_s = 1e6;
  time_collectives(untimed, table, effects);
  EXPECT_NEAR(untimed.front().seconds - list.front().seconds, gather.local_bytes / 1e6, 1e-12);
}

}  // namespace
}  // namespace amsp::plan
