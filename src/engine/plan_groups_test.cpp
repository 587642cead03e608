#include "engine/plan_groups.h"

#include <gtest/gtest.h>

namespace amsp::engine {
namespace {

using Paths = std::vector<std::vector<std::string>>;

// A Slurm topology by hand: node names[i] under switch path paths[i], `per_node`
// ranks each, and the cluster's leaf switch sizes when known.
topology::Topology layout(const std::vector<std::string>& names, const Paths& paths, int per_node,
                          std::map<std::string, int> switch_nodes = {}) {
  std::vector<topology::RankView> views;
  for (size_t n = 0; n < names.size(); ++n)
    for (int local = 0; local < per_node; ++local) {
      topology::RankView v;
      v.rank = static_cast<int>(views.size());
      v.node_name = names[n];
      v.node_index = static_cast<int>(n);
      v.local_rank = local;
      v.switches = paths[n];
      views.push_back(v);
    }
  topology::Topology t = topology::assemble(views, 0, "slurm");
  t.switch_nodes = std::move(switch_nodes);
  return t;
}

std::string notes(const topology::Topology& t, const std::string& plan_text) {
  const plan::MeshShape shape{t.local_size, t.num_nodes};
  return placement_notes(plan::Mesh(plan::parse_shard_plan(plan_text, shape), shape), t);
}

const Paths kTwoSwitches = {{"top", "s1"}, {"top", "s1"}, {"top", "s2"}, {"top", "s2"}};

// slurm/local-cluster: n1, n2 under s1, n3, n4 under s2, 2 ranks each.
TEST(PlacementNotes, LocalCluster) {
  const auto t = layout({"n1", "n2", "n3", "n4"}, kTwoSwitches, 2, {{"s1", 2}, {"s2", 2}});
  EXPECT_EQ(notes(t, "ddp"),
            "replica 8 ranks on 4 nodes (across leaf switches: plan size, no switch holds 4 nodes)");
  EXPECT_EQ(notes(t, "zero3"),
            "P 8 ranks on 4 nodes (across leaf switches: plan size, no switch holds 4 nodes)");
  EXPECT_EQ(notes(t, "mics:2"),
            "P 2 ranks in a node; "
            "replica 4 ranks on 4 nodes (across leaf switches: plan size, no switch holds 4 nodes)");
  // P blocks of two nodes each fill a switch; a replica group takes one node of each.
  EXPECT_EQ(notes(t, "mics:4"),
            "P 4 ranks on 2 nodes (under one leaf switch); replica 2 ranks on 2 nodes (across "
            "leaf switches: block alignment, n1 (s1) and n3 (s2) in one group)");
  // OS: the same local rank of two nodes under one switch.
  EXPECT_EQ(notes(t, "p=1,g=2x1,os=2x2"),
            "G 2 ranks in a node; OS 2 ranks on 2 nodes (under one leaf switch); "
            "replica 2 ranks on 2 nodes (across leaf switches: block alignment, n1 (s1) and n3 (s2) "
            "in one group); gather 4 ranks on 2 nodes (under one leaf switch)");
}

TEST(PlacementNotes, SwitchSizesUnknown) {
  // Without topology.conf the plan's size cannot be told from the allocation's.
  const auto t = layout({"n1", "n2", "n3", "n4"}, kTwoSwitches, 2);
  EXPECT_EQ(notes(t, "zero3"),
            "P 8 ranks on 4 nodes (across leaf switches: allocation, at most 2 of its nodes under "
            "one switch)");
  // A switch of 4 nodes of which the job got 2: the allocation, not the plan.
  const auto big = layout({"n1", "n2", "n3", "n4"}, kTwoSwitches, 2, {{"s1", 4}, {"s2", 4}});
  EXPECT_EQ(notes(big, "ddp"),
            "replica 8 ranks on 4 nodes (across leaf switches: allocation, at most 2 of its nodes "
            "under one switch)");
}

TEST(PlacementNotes, InterleavedSwitches) {
  // The cluster: n1, n3, n4 under s1, n2, n5, n6, n7 under s2. The job's n2, n5, n6
  // under s2, n3 under s1: switch order n3 | n2 n5 n6.
  const auto t = layout({"n2", "n3", "n5", "n6"}, {{"top", "s2"}, {"top", "s1"}, {"top", "s2"}, {"top", "s2"}},
                        2, {{"s1", 3}, {"s2", 4}});
  EXPECT_EQ(t.node_order, std::vector<int>({1, 0, 2, 3}));
  // Blocks n3+n2 (across) and n5+n6 (under s2): 3 nodes share s2, so alignment.
  EXPECT_EQ(notes(t, "mics:4"),
            "P 4 ranks on 2 nodes (1 of 2 groups across leaf switches: block alignment, n3 (s1) and "
            "n2 (s2) in one group); replica 2 ranks on 2 nodes (2 of 4 groups across leaf switches: "
            "block alignment, n3 (s1) and n5 (s2) in one group)");
  EXPECT_EQ(notes(t, "mics:2"),
            "P 2 ranks in a node; replica 4 ranks on 4 nodes (across leaf switches: allocation, at "
            "most 3 of its nodes under one switch)");
}

TEST(PlacementNotes, AllocationOnePerSwitch) {
  const auto t = layout({"n1", "n3", "n5", "n7"}, {{"s1"}, {"s2"}, {"s3"}, {"s4"}}, 1,
                        {{"s1", 2}, {"s2", 2}, {"s3", 2}, {"s4", 2}});
  EXPECT_EQ(notes(t, "mics:2"),
            "P 2 ranks on 2 nodes (across leaf switches: allocation, at most 1 of its nodes under one "
            "switch); replica 2 ranks on 2 nodes (across leaf switches: allocation, at most 1 of its "
            "nodes under one switch)");
}

TEST(PlacementNotes, NoSwitchInformation) {
  const auto t = layout({"a", "b"}, {{}, {}}, 2);
  EXPECT_EQ(notes(t, "zero3"), "P 4 ranks on 2 nodes");
  EXPECT_EQ(notes(layout({"a"}, {{}}, 1), "ddp"), "no communication groups (one rank)");
}

}  // namespace
}  // namespace amsp::engine
