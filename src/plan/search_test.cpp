#include "plan/search.h"

#include <gtest/gtest.h>

#include <set>

#include "core/error.h"

namespace amsp::plan {
namespace {

PlanInput small_input(int64_t ranks_per_node, int64_t nodes, int64_t memory) {
  PlanInput in;
  in.workload.model = model::load_config("small");
  in.workload.seq_len = 256;
  in.workload.micro_batch = 2;
  in.mesh = {ranks_per_node, nodes};
  in.global_batch_tokens = 2 * 256 * 2 * in.mesh.world();  // 2 micro-batches
  in.memory_per_rank = memory;
  use_cluster(in, load_cluster("a800", "cluster"));
  // A slow machine so that communication matters against compute.
  in.compute.peak_flops_per_s = 2e12;
  in.compute.flops_per_s = 1e12;
  return in;
}

TEST(Search, EnumeratesExactlyTheValidPlans) {
  const MeshShape mesh{4, 4};
  const auto plans = enumerate_plans(mesh);
  std::set<std::string> seen;
  for (const ShardPlan& p : plans) {
    EXPECT_NO_THROW(validate(p, mesh));
    EXPECT_TRUE(seen.insert(to_string(p)).second) << to_string(p);
  }
  // Factors: 1x1, 2x1, 4x1, 4x2, 4x4 form a chain under "divides": every
  // non-decreasing triple is valid, C(5 + 2, 3) = 35.
  EXPECT_EQ(plans.size(), 35u);
  for (const char* named : {"ddp", "zero1", "zero2", "zero3", "mics:4", "mics:8"})
    EXPECT_TRUE(seen.count(to_string(parse_shard_plan(named, mesh)))) << named;
  // 6 ranks per node: 1, 2, 3, 6 are not a chain (2 does not divide 3).
  // Triples a | b | c: c = 1: 1, c = 2: 3, c = 3: 3, c = 6: 1 + 2 + 2 + 4 = 9.
  EXPECT_EQ(enumerate_plans(MeshShape{6, 1}).size(), 16u);
}

TEST(Search, RankedBestFirstAndFitsMemory) {
  const PlanInput in = small_input(2, 2, int64_t{1} << 40);
  const auto ranked = search(in);
  ASSERT_FALSE(ranked.empty());
  for (size_t i = 0; i + 1 < ranked.size(); ++i) {
    ASSERT_TRUE(ranked[i].fits);
    EXPECT_FALSE(better(ranked[i + 1], ranked[i])) << i;
  }
  EXPECT_EQ(choose_plan(in).plan, ranked.front().plan);
}

TEST(Search, MemoryFilterAndExcludedReasons) {
  PlanInput in = small_input(2, 2, int64_t{1} << 40);
  const int64_t ddp = evaluate(in, parse_shard_plan("ddp", in.mesh)).memory.total();
  const int64_t zero3 = evaluate(in, parse_shard_plan("zero3", in.mesh)).memory.total();
  ASSERT_LT(zero3, ddp);
  in.memory_per_rank = (ddp + zero3) / 2;
  const auto ranked = search(in);
  // The margin: a plan fits in memory_per_rank less kMemoryMargin of it.
  for (const Evaluation& e : ranked)
    EXPECT_EQ(e.fits, e.memory.total() <= in.memory_per_rank * (1 - kMemoryMargin) + 1);
  const auto named = named_results(in, ranked);
  ASSERT_EQ(named.size(), 7u);
  EXPECT_EQ(named[0].name, "ddp");
  EXPECT_NE(named[0].excluded.find("needs"), std::string::npos);
  EXPECT_NE(named[0].excluded.find("per GPU, may use"), std::string::npos);
  EXPECT_EQ(named[3].name, "zero3");
  EXPECT_TRUE(named[3].excluded.empty());
  EXPECT_GT(named[3].rank, 0);
  EXPECT_EQ(ranked[static_cast<size_t>(named[3].rank - 1)].plan, named[3].eval->plan);
  // mics:8 on 2 nodes of 2 ranks is not a plan: excluded with the rule.
  EXPECT_EQ(named[6].name, "mics:8");
  EXPECT_FALSE(named[6].eval.has_value());
  EXPECT_NE(named[6].excluded.find("does not fit"), std::string::npos);
  // Nothing fits: choose_plan says how much the smallest needs.
  in.memory_per_rank = 1024;
  try {
    choose_plan(in);
    ADD_FAILURE();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("no shard plan fits"), std::string::npos);
  }
}

// A plan's memory is the memory model's, temporaries included, and follows the
// engine's prefetch and max_reductions options carried by the workload.
TEST(Search, MemoryIsTheModelsWithTheEngineOptions) {
  PlanInput in = small_input(2, 2, int64_t{1} << 40);
  const ShardPlan zero3 = parse_shard_plan("zero3", in.mesh);
  const Evaluation e = evaluate(in, zero3);
  EXPECT_EQ(e.memory.total(), memory_per_rank(in.workload, zero3, 4).total());
  EXPECT_GT(e.memory.gathered, 0);
  EXPECT_GT(e.memory.buckets, 0);
  // One more gathered unit and one reduction slot fewer than the defaults (2
  // and 4): +1/3 and -1/4.
  ASSERT_EQ(in.workload.prefetch, 2);
  ASSERT_EQ(in.workload.max_reductions, 4);
  in.workload.prefetch = 3;
  in.workload.max_reductions = 3;
  const Evaluation more = evaluate(in, zero3);
  EXPECT_EQ(more.memory.gathered, e.memory.gathered / 3 * 4);
  EXPECT_EQ(more.memory.buckets, e.memory.buckets / 4 * 3);
  EXPECT_EQ(more.memory.model_states(), e.memory.model_states());
}

// More memory never makes the best plan expose more communication (beyond
// the tie resolution), on any mesh, at any batch.
TEST(Search, MoreMemoryNeverHurts) {
  for (auto [R, N] : {std::pair<int64_t, int64_t>{2, 2}, {4, 2}, {8, 1}, {2, 4}}) {
    PlanInput in = small_input(R, N, 0);
    in.memory_margin = 0;
    const auto all = search(in);
    int64_t lo = all.front().memory.total(), hi = 0;
    for (const auto& e : all) hi = std::max(hi, e.memory.total());
    double previous = 1e300;
    for (int i = 0; i <= 16; ++i) {
      in.memory_per_rank = lo + (hi - lo) * i / 16;
      const Evaluation best = choose_plan(in);
      EXPECT_LE(best.cost.exposed_s, previous + kTieResolution * best.cost.compute_s)
          << R << "x" << N << " memory " << in.memory_per_rank;
      previous = std::min(previous, best.cost.exposed_s);
    }
  }
}

TEST(Search, SingleRankHasNothingToSend) {
  const PlanInput in = small_input(1, 1, int64_t{1} << 40);
  const auto ranked = search(in);
  ASSERT_EQ(ranked.size(), 1u);
  EXPECT_TRUE(ranked[0].collectives.empty());
  EXPECT_EQ(ranked[0].cost.exposed_s, 0.0);
  EXPECT_EQ(ranked[0].cost.nic_bytes(), 0);
  EXPECT_GT(ranked[0].cost.optimizer_s, 0.0);
  EXPECT_EQ(ranked[0].cost.step_s, ranked[0].cost.compute_s + ranked[0].cost.optimizer_s);
}

// The objective's order: exposed communication (ticks), then NIC bytes per
// node, then memory. Two plans that tie on exposure: fewer NIC bytes wins even
// with more memory.
TEST(Search, TiesGoToFewerNicBytesThenLessMemory) {
  PlanInput in = small_input(2, 2, int64_t{1} << 40);
  in.compute.flops_per_s = 1e9;  // everything hides: every plan ties on exposure
  const auto ranked = search(in);
  for (size_t i = 0; i + 1 < ranked.size(); ++i) {
    const Evaluation &a = ranked[i], &b = ranked[i + 1];
    if (exposed_ticks(a) != exposed_ticks(b)) continue;
    EXPECT_LE(a.cost.nic_bytes(), b.cost.nic_bytes()) << to_string(a.plan) << " " << to_string(b.plan);
    if (a.cost.nic_bytes() == b.cost.nic_bytes())
      EXPECT_LE(a.memory.total(), b.memory.total()) << to_string(a.plan) << " " << to_string(b.plan);
  }
  // ddp moves more NIC bytes than zero1 (a whole-unit all-reduce against a
  // reduce-scatter and an all-gather) and needs more memory: it is not first.
  EXPECT_NE(to_string(ranked.front().plan), to_string(parse_shard_plan("ddp", in.mesh)));
  const std::string why = why_better(ranked[0], ranked[1]);
  EXPECT_NE(why.find("a tie"), std::string::npos) << why;
}

TEST(Search, TokenCounts) {
  EXPECT_EQ(parse_token_count("4M", "global-batch"), 4194304);
  EXPECT_EQ(parse_token_count("4Mi", "global-batch"), 4194304);
  EXPECT_EQ(parse_token_count("512K", "global-batch"), 524288);
  EXPECT_EQ(parse_token_count("1G", "global-batch"), int64_t{1} << 30);
  EXPECT_EQ(parse_token_count("4096", "global-batch"), 4096);
  for (const char* bad : {"", "M", "4X", "-4M", "0", "4.5M", "4MB"}) {
    try {
      parse_token_count(bad, "global-batch");
      ADD_FAILURE() << bad;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--global-batch"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace amsp::plan

namespace amsp::plan {
namespace {

// The planner compresses only when --compress auto allows it, and then picks,
// per plan, the best of off and the candidates by the ranking's own keys.
TEST(Search, CompressesOnlyWhenAllowed) {
  PlanInput in = small_input(2, 4, int64_t{1} << 40);
  for (const Evaluation& e : search(in)) EXPECT_FALSE(e.compression.any()) << to_string(e.plan);
  in.workload.compression = parse_compression("auto");
  const ShardPlan zero3 = parse_shard_plan("zero3", in.mesh);
  const Evaluation chosen = evaluate(in, zero3);
  PlanInput each = in;
  each.workload.compression = {};
  EXPECT_FALSE(better(evaluate(each, zero3), chosen));
  for (const Compression& c : compression_candidates()) {
    each.workload.compression = c;
    EXPECT_FALSE(better(evaluate(each, zero3), chosen)) << to_string(c);
  }
  // zero3 over 4 nodes gathers and reduces across them: compressing pays.
  EXPECT_TRUE(chosen.compression.any());
  bool any = false;
  for (const Evaluation& e : search(in)) any = any || e.compression.any();
  EXPECT_TRUE(any);
}

}  // namespace
}  // namespace amsp::plan
