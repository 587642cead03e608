#include "plan/mesh.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "core/error.h"
#include "plan/shard_plan.h"

namespace amsp::plan {
namespace {

const MeshShape k4x2{/*ranks_per_node=*/2, /*nodes=*/4};  // 8 ranks on 4 nodes

TEST(ShardPlan, NamedPlansMapToFactors) {
  EXPECT_EQ(to_string(parse_shard_plan("ddp", k4x2)), "p=1x1,g=1x1,os=1x1");
  EXPECT_EQ(to_string(parse_shard_plan("zero1", k4x2)), "p=1x1,g=1x1,os=2x4");
  EXPECT_EQ(to_string(parse_shard_plan("zero2", k4x2)), "p=1x1,g=2x4,os=2x4");
  EXPECT_EQ(to_string(parse_shard_plan("zero3", k4x2)), "p=2x4,g=2x4,os=2x4");
  EXPECT_EQ(parse_shard_plan("fsdp", k4x2), parse_shard_plan("zero3", k4x2));
  EXPECT_EQ(to_string(parse_shard_plan("mics:2", k4x2)), "p=2x1,g=2x1,os=2x1");
  EXPECT_EQ(to_string(parse_shard_plan("mics:4", k4x2)), "p=2x2,g=2x2,os=2x2");
}

TEST(ShardPlan, ExplicitFactors) {
  const MeshShape m{8, 2};
  EXPECT_EQ(to_string(parse_shard_plan("p=4x1,g=4x1,os=8x1", m)), "p=4x1,g=4x1,os=8x1");
  EXPECT_EQ(to_string(parse_shard_plan("p=1,g=2x1,os=4x1", m)), "p=1x1,g=2x1,os=4x1");
  EXPECT_EQ(to_string(parse_shard_plan("os=16", m)), "p=1x1,g=1x1,os=8x2");
  EXPECT_EQ(to_string(parse_shard_plan("p=2", m)), "p=2x1,g=2x1,os=2x1");  // inherits
}

TEST(ShardPlan, RulesAreEnforcedWithReasons) {
  auto message = [](const std::string& plan, const MeshShape& m) {
    try {
      parse_shard_plan(plan, m);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const MeshShape m{8, 4};
  EXPECT_NE(message("p=3x1", m).find("must divide the 8 ranks per node"), std::string::npos);
  EXPECT_NE(message("os=8x3", m).find("nodes must divide the 4 nodes"), std::string::npos);
  EXPECT_NE(message("os=4x2", m).find("must fill them (8x2)"), std::string::npos);
  EXPECT_NE(message("p=4x1,g=2x1", m).find("p | g"), std::string::npos);
  EXPECT_NE(message("g=8x2,os=8x1", m).find("g | os"), std::string::npos);
  EXPECT_NE(message("mics:3", m).find("does not fit"), std::string::npos);
  EXPECT_NE(message("zero4", m).find("unknown plan"), std::string::npos);
  EXPECT_NE(message("q=2", m).find("unknown state 'q'"), std::string::npos);
  EXPECT_NE(message("p=2,p=2", m).find("given twice"), std::string::npos);
  EXPECT_NE(message("p=abc", m).find("not a positive integer"), std::string::npos);
}

// Every group kind partitions the world, members agree on their group, and
// the index of a member is its place in the member list.
void check_partition(const Mesh& mesh) {
  const int64_t d = mesh.shape().world();
  for (GroupKind kind : kAllGroups) {
    std::set<int64_t> seen;
    for (int64_t pos = 0; pos < d; ++pos) {
      const auto members = mesh.group_members(kind, pos);
      ASSERT_EQ(static_cast<int64_t>(members.size()), mesh.group_size(kind));
      ASSERT_EQ(members[mesh.index_in_group(kind, pos)], pos) << group_name(kind);
      for (int64_t m : members) EXPECT_EQ(mesh.group_members(kind, m), members);
      seen.insert(pos);
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), d);
  }
}

// Shards nest (OS inside G inside P), the P group covers the whole unit, the G
// group covers the P-shard, the gather group rebuilds the P-shard in order,
// and a replica group holds one OS slice.
void check_shards(const Mesh& mesh) {
  const int64_t d = mesh.shape().world();
  const int64_t p_ranks = mesh.plan().p.size(), g_ranks = mesh.plan().g.size(),
                os_ranks = mesh.plan().os.size();
  for (int64_t pos = 0; pos < d; ++pos) {
    const int64_t os = mesh.os_shard_index(pos);
    const int64_t g_lo = mesh.g_shard_index(pos) * (os_ranks / g_ranks);
    const int64_t p_lo = mesh.p_shard_index(pos) * (os_ranks / p_ranks);
    EXPECT_TRUE(os >= g_lo && os < g_lo + os_ranks / g_ranks);
    EXPECT_TRUE(g_lo >= p_lo && g_lo + os_ranks / g_ranks <= p_lo + os_ranks / p_ranks);

    const auto gather = mesh.group_members(GroupKind::kGather, pos);
    for (size_t j = 0; j < gather.size(); ++j)
      EXPECT_EQ(mesh.os_shard_index(gather[j]), p_lo + static_cast<int64_t>(j));
    const auto p_group = mesh.group_members(GroupKind::kP, pos);
    for (size_t j = 0; j < p_group.size(); ++j)
      EXPECT_EQ(mesh.p_shard_index(p_group[j]), static_cast<int64_t>(j));
    for (int64_t m : mesh.group_members(GroupKind::kG, pos))
      EXPECT_EQ(mesh.p_shard_index(m), mesh.p_shard_index(pos));
    for (int64_t m : mesh.group_members(GroupKind::kReplica, pos))
      EXPECT_EQ(mesh.os_shard_index(m), os);
  }
}

TEST(Mesh, GroupsAndShardsForEveryValidPlan) {
  for (const MeshShape shape : {MeshShape{2, 4}, MeshShape{4, 2}, MeshShape{8, 4}, MeshShape{1, 4}}) {
    int plans = 0;
    const auto sizes = [&](int64_t n) {
      std::vector<int64_t> v;
      for (int64_t k = 1; k <= n; ++k)
        if (n % k == 0) v.push_back(k);
      return v;
    };
    // Enumerate all factors, keep the valid plans.
    std::vector<Factor> factors;
    for (int64_t s0 : sizes(shape.ranks_per_node))
      for (int64_t s1 : sizes(shape.nodes)) factors.push_back({s0, s1});
    for (const auto& p : factors)
      for (const auto& g : factors)
        for (const auto& os : factors) {
          ShardPlan plan{p, g, os, "enumerated"};
          try {
            validate(plan, shape);
          } catch (const UsageError&) {
            continue;
          }
          ++plans;
          Mesh mesh(plan, shape);
          check_partition(mesh);
          check_shards(mesh);
        }
    EXPECT_GT(plans, 3);
  }
}

TEST(Mesh, MembersOnFourNodesOfTwo) {
  // p=2x1,g=2x1,os=8x1 is not valid on 2 ranks per node; use a mixed plan that is.
  Mesh mesh(parse_shard_plan("p=1,g=2x1,os=2x2", k4x2), k4x2);
  EXPECT_EQ(mesh.group_members(GroupKind::kP, 5), (std::vector<int64_t>{5}));
  EXPECT_EQ(mesh.group_members(GroupKind::kG, 5), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(mesh.group_members(GroupKind::kOS, 5), (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(mesh.group_members(GroupKind::kReplica, 5), (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(mesh.group_members(GroupKind::kGather, 5), (std::vector<int64_t>{4, 6, 5, 7}));
  EXPECT_EQ(mesh.group_nodes(GroupKind::kG), 1);
  EXPECT_EQ(mesh.group_nodes(GroupKind::kOS), 2);
  EXPECT_EQ(mesh.group_nodes(GroupKind::kReplica), 2);

  Mesh zero3(parse_shard_plan("zero3", k4x2), k4x2);
  EXPECT_EQ(zero3.group_size(GroupKind::kP), 8);
  EXPECT_EQ(zero3.group_size(GroupKind::kReplica), 1);
  EXPECT_EQ(zero3.group_size(GroupKind::kGather), 1);
  Mesh zero1(parse_shard_plan("zero1", k4x2), k4x2);
  EXPECT_EQ(zero1.group_size(GroupKind::kOS), 8);
  EXPECT_EQ(zero1.group_size(GroupKind::kGather), 8);
  EXPECT_EQ(zero1.group_size(GroupKind::kP), 1);
}

}  // namespace
}  // namespace amsp::plan
