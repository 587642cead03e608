#include "plan/bandwidth.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "model/config.h"

namespace amsp::plan {
namespace {

using comm::Op;

comm::BandwidthEntry entry(Op op, int64_t p0, int64_t p1, int64_t bytes, double time_us) {
  comm::BandwidthEntry e;
  e.op = op;
  e.ranks_per_node = p0;
  e.nodes = p1;
  e.bytes = bytes;
  e.time_us = time_us;
  e.algbw_GBps = static_cast<double>(bytes) / (time_us * 1e3);
  e.busbw_GBps = e.algbw_GBps * comm::busbw_factor(op, p0 * p1);
  return e;
}

BandwidthTable small_table() {
  comm::BandwidthTable t;
  t.entries = {entry(Op::kAllGather, 2, 1, 1000, 10), entry(Op::kAllGather, 2, 1, 100000, 30),
               entry(Op::kAllGather, 2, 1, 10000000, 1000), entry(Op::kAllGather, 1, 2, 1000, 40),
               entry(Op::kAllGather, 1, 1, 1000, 1)};
  return BandwidthTable(t, "test");
}

TEST(Bandwidth, InterpolatesClampsAndBorrows) {
  const BandwidthTable t = small_table();
  EXPECT_DOUBLE_EQ(t.seconds(Op::kAllGather, 1000, 2, 1), 10e-6);
  EXPECT_DOUBLE_EQ(t.seconds(Op::kAllGather, 10, 2, 1), 10e-6);  // latency floor
  EXPECT_NEAR(t.seconds(Op::kAllGather, 10000, 2, 1), 20e-6, 1e-12);  // halfway in log size
  // Above the largest size the largest's bandwidth holds.
  EXPECT_NEAR(t.seconds(Op::kAllGather, 20000000, 2, 1), 2000e-6, 1e-12);
  // 4x1 borrows 2x1 (same kind: one node), rescaled by (3/4) / (1/2).
  EXPECT_NEAR(t.seconds(Op::kAllGather, 1000, 4, 1), 15e-6, 1e-15);
  // 1x4 borrows the inter-node 1x2, (3/4) / (1/2) as well.
  EXPECT_NEAR(t.seconds(Op::kAllGather, 1000, 1, 4), 60e-6, 1e-15);
  // Groups of one cost nothing.
  EXPECT_EQ(t.seconds(Op::kAllGather, 1000, 1, 1), 0.0);
  // No inter-node rows for reduce-scatter at all: a clear error.
  try {
    t.seconds(Op::kReduceScatter, 1000, 2, 2);
    ADD_FAILURE();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("no inter-node reduce_scatter"), std::string::npos);
  }
}

TEST(Bandwidth, MeasuredShape) {
  // Node groups of 2x1 and cross-node ones of 1x2: measured on 2 ranks x 2 nodes.
  EXPECT_EQ(small_table().measured_shape().ranks_per_node, 2);
  EXPECT_EQ(small_table().measured_shape().nodes, 2);
  EXPECT_EQ(BandwidthTable().measured_shape().world(), 1);
  const MeshShape local = load_bandwidth_table(model::inputs_dir() + "/bandwidth/localcluster-2x4.json", "t")
                              .measured_shape();
  EXPECT_EQ(local.ranks_per_node, 2);
  EXPECT_EQ(local.nodes, 4);
}

TEST(Bandwidth, ClusterPresetsLoad) {
  for (const char* name : {"a800", "h100"}) {
    const Cluster c = load_cluster(name, "cluster");
    EXPECT_EQ(c.gpus_per_node, 8) << name;
    EXPECT_EQ(c.gpu_memory, int64_t{80} << 30) << name;
    EXPECT_TRUE(c.modelled) << name;
    EXPECT_GT(c.peak_tflops_bf16, c.peak_tflops_fp32) << name;
    // NVLink is faster than the network for a 1 GiB all-gather.
    const int64_t gib = int64_t{1} << 30;
    EXPECT_LT(c.bandwidth.seconds(Op::kAllGather, gib, 8, 1),
              c.bandwidth.seconds(Op::kAllGather, gib, 8, 2)) << name;
    // Fewer ranks per node share the node's NICs: slower across nodes.
    EXPECT_LT(c.bandwidth.seconds(Op::kAllReduce, gib, 8, 4),
              c.bandwidth.seconds(Op::kAllReduce, gib, 1, 4)) << name;
  }
  EXPECT_THROW(load_cluster("no-such-cluster", "cluster"), UsageError);
}

}  // namespace
}  // namespace amsp::plan

namespace amsp::plan {
namespace {

// A table without all_to_all prices one as a reduce-scatter of the same size (the
// compressed reductions' records, doc/compression.md); one that has it uses its own.
TEST(Bandwidth, AllToAllBorrowsTheReduceScatterUntilMeasured) {
  comm::BandwidthTable t;
  t.entries = {entry(Op::kReduceScatter, 2, 1, 1000, 10), entry(Op::kReduceScatter, 2, 1, 100000, 30)};
  const BandwidthTable without(t, "t");
  EXPECT_DOUBLE_EQ(without.seconds(Op::kAllToAll, 50000, 2, 1), without.seconds(Op::kReduceScatter, 50000, 2, 1));
  EXPECT_THROW(without.seconds(Op::kAllToAll, 50000, 2, 2), UsageError);  // no inter-node curve at all
  t.entries.push_back(entry(Op::kAllToAll, 2, 1, 1000, 20));
  t.entries.push_back(entry(Op::kAllToAll, 2, 1, 100000, 60));
  const BandwidthTable with(t, "t");
  EXPECT_GT(with.seconds(Op::kAllToAll, 50000, 2, 1), with.seconds(Op::kReduceScatter, 50000, 2, 1));
}

}  // namespace
}  // namespace amsp::plan
