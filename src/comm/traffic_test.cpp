#include "comm/traffic.h"

#include <gtest/gtest.h>

#include "comm/bandwidth_table.h"
#include "comm/bench.h"
#include "core/error.h"

namespace amsp::comm {
namespace {

TEST(Traffic, RingVolumesPerRank) {
  // 4 ranks, 1000 floats per rank: 3 blocks of 4000 bytes go out and come in.
  EXPECT_EQ(traffic_bytes(Op::kAllGather, 1000, 4), (Traffic{12000, 12000}));
  EXPECT_EQ(traffic_bytes(Op::kReduceScatter, 1000, 4), (Traffic{12000, 12000}));
  // All-reduce of 1000 floats = reduce-scatter + all-gather of 250-float blocks.
  EXPECT_EQ(traffic_bytes(Op::kAllReduce, 1000, 4), (Traffic{6000, 6000}));
  // Uneven: 1001 floats over 4 ranks pads to blocks of 251.
  EXPECT_EQ(traffic_bytes(Op::kAllReduce, 1001, 4), (Traffic{2 * 3 * 251 * 4, 2 * 3 * 251 * 4}));
  EXPECT_EQ(traffic_bytes(Op::kBroadcast, 10, 4, /*rank=*/2, /*root=*/2), (Traffic{40, 0}));
  EXPECT_EQ(traffic_bytes(Op::kBroadcast, 10, 4, /*rank=*/1, /*root=*/2), (Traffic{0, 40}));
  EXPECT_EQ(traffic_bytes(Op::kAllGather, 10, 3, 0, 0, /*elem_bytes=*/2), (Traffic{40, 40}));
}

TEST(Traffic, AllToAllSendsABlockToEachOtherRank) {
  // 3 ranks, 1000 int32 per destination: two blocks go out, two come in; the
  // block a rank keeps for itself is a local copy and costs nothing.
  EXPECT_EQ(traffic_bytes(Op::kAllToAll, 1000, 3), (Traffic{8000, 8000}));
  EXPECT_EQ(traffic_bytes(Op::kAllToAll, 7, 4, /*rank=*/3, 0, /*elem_bytes=*/2), (Traffic{42, 42}));
  EXPECT_EQ(traffic_bytes(Op::kAllToAll, 7, 2, 1, /*root=*/1), (Traffic{28, 28}));  // root is ignored
}

TEST(Traffic, NothingMovesInAGroupOfOneOrForZeroElements) {
  for (Op op : kAllOps) {
    EXPECT_EQ(traffic_bytes(op, 1000, 1), Traffic{}) << op_name(op);
    EXPECT_EQ(traffic_bytes(op, 0, 8), Traffic{}) << op_name(op);
  }
}

TEST(Traffic, OpNamesRoundTrip) {
  for (Op op : kAllOps) EXPECT_EQ(parse_op(op_name(op)), op);
  EXPECT_EQ(parse_op("all-reduce"), Op::kAllReduce);
  EXPECT_EQ(parse_op("allgather"), Op::kAllGather);
  EXPECT_EQ(parse_op("alltoall"), Op::kAllToAll);
  EXPECT_EQ(parse_op("all-to-all"), Op::kAllToAll);
  EXPECT_STREQ(op_name(Op::kAllToAll), "all_to_all");
  EXPECT_FALSE(parse_op("all_to_one"));
}

TEST(Padding, BlocksCoverTheBufferAndPadTheTail) {
  EXPECT_EQ(block_count(1001, 4), 251);
  EXPECT_EQ(padded_count(1001, 4), 1004);
  EXPECT_EQ(padded_count(1000, 4), 1000);
  EXPECT_EQ(padded_count(0, 4), 0);
  EXPECT_EQ(padded_count(3, 8), 8);
  for (int64_t n : {0, 1, 3, 1000, 1001, 1003}) {
    for (int64_t g : {1, 2, 3, 4, 8}) {
      int64_t covered = 0;
      for (int64_t i = 0; i < g; ++i) {
        const Span s = real_part_of_block(n, g, i);
        EXPECT_EQ(s.begin, std::min(n, i * block_count(n, g)));
        EXPECT_LE(s.length, block_count(n, g));
        covered += s.length;
      }
      EXPECT_EQ(covered, n) << n << " over " << g;
    }
  }
  // 3 elements over 8 ranks: blocks of one, the last five wholly padding.
  EXPECT_EQ(real_part_of_block(3, 8, 2).length, 1);
  EXPECT_EQ(real_part_of_block(3, 8, 3).length, 0);
}

TEST(Bench, BusBandwidthFactorsAreNcclTests) {
  EXPECT_DOUBLE_EQ(busbw_factor(Op::kAllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(busbw_factor(Op::kAllGather, 4), 0.75);
  EXPECT_DOUBLE_EQ(busbw_factor(Op::kReduceScatter, 8), 0.875);
  EXPECT_DOUBLE_EQ(busbw_factor(Op::kBroadcast, 8), 1.0);
  EXPECT_EQ(bench_size_bytes(Op::kAllGather, 256, 4), 4096);  // the gathered buffer
  EXPECT_EQ(bench_size_bytes(Op::kAllReduce, 256, 4), 1024);
  EXPECT_DOUBLE_EQ(busbw_factor(Op::kAllToAll, 4), 0.75);  // nccl-tests' alltoall_perf
  EXPECT_EQ(bench_size_bytes(Op::kAllToAll, 256, 4), 4096);  // the whole send buffer
}

TEST(Bench, SizesAndByteParsing) {
  EXPECT_EQ(parse_bytes("1K", "x"), 1024);
  EXPECT_EQ(parse_bytes("256M", "x"), 256 << 20);
  EXPECT_EQ(parse_bytes("1G", "x"), int64_t{1} << 30);
  EXPECT_EQ(parse_bytes("4KiB", "x"), 4096);
  EXPECT_EQ(parse_bytes("4096", "x"), 4096);
  EXPECT_EQ(parse_bytes("2MB", "x"), 2 << 20);
  EXPECT_THROW(parse_bytes("lots", "max-bytes"), UsageError);
  EXPECT_THROW(parse_bytes("-1K", "max-bytes"), UsageError);
  EXPECT_EQ(format_bytes(1024), "1K");
  EXPECT_EQ(format_bytes(256 << 20), "256M");
  EXPECT_EQ(format_bytes(1000), "1000");
  EXPECT_EQ(bench_sizes(1024, 8192, 2), (std::vector<int64_t>{1024, 2048, 4096, 8192}));
  EXPECT_EQ(bench_sizes(1024, 5000, 4), (std::vector<int64_t>{1024, 4096, 5000}));
}

TEST(BandwidthTable, InterpolatesInLogSizeAndExtrapolatesWithBandwidth) {
  BandwidthTable t;
  t.entries = {{Op::kAllReduce, 4, 1, 1024, 10.0, 0.1024, 0.15},
               {Op::kAllReduce, 4, 1, 4096, 30.0, 0.1365, 0.2},
               {Op::kAllReduce, 2, 2, 1024, 50.0, 0.02, 0.03}};
  EXPECT_DOUBLE_EQ(*t.time_us(Op::kAllReduce, 4, 1, 1024), 10.0);
  EXPECT_DOUBLE_EQ(*t.time_us(Op::kAllReduce, 4, 1, 2048), 20.0);  // halfway in log2
  EXPECT_DOUBLE_EQ(*t.time_us(Op::kAllReduce, 4, 1, 100), 10.0);   // latency floor
  EXPECT_NEAR(*t.time_us(Op::kAllReduce, 4, 1, 8192), 8192 / (0.1365 * 1e3), 1e-9);
  EXPECT_DOUBLE_EQ(*t.time_us(Op::kAllReduce, 2, 2, 1024), 50.0);
  EXPECT_FALSE(t.time_us(Op::kAllGather, 4, 1, 1024));
  EXPECT_FALSE(t.time_us(Op::kAllReduce, 8, 1, 1024));
}

TEST(BandwidthTable, JsonRoundTripAndErrors) {
  BandwidthTable t;
  t.cluster = "test";
  t.backend = "mpi/thread";
  t.entries = {{Op::kAllGather, 2, 1, 1024, 12.5, 0.08192, 0.04096}};
  const BandwidthTable u = parse_bandwidth_table(to_json(t), "t.json");
  EXPECT_EQ(u.cluster, "test");
  ASSERT_EQ(u.entries.size(), 1u);
  EXPECT_EQ(u.entries[0].op, Op::kAllGather);
  EXPECT_EQ(u.entries[0].bytes, 1024);
  EXPECT_DOUBLE_EQ(u.entries[0].time_us, 12.5);
  auto message = [](const std::string& text) {
    try {
      parse_bandwidth_table(text, "t.json");
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("{").find("not JSON"), std::string::npos);
  EXPECT_NE(message("{\"entries\": []}").find("amsp-bandwidth-table"), std::string::npos);
  EXPECT_NE(message(R"({"format":"amsp-bandwidth-table","version":1,"entries":[{"op":"gather"}]})")
                .find("entries[0]: op 'gather'"),
            std::string::npos);
  EXPECT_NE(message(R"({"format":"amsp-bandwidth-table","version":1,"entries":[{"op":"all_reduce"}]})")
                .find("expected op, ranks_per_node"),
            std::string::npos);
}

}  // namespace
}  // namespace amsp::comm
