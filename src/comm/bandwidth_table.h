// The measured bandwidth table (format: inputs/bandwidth/README.md): what
// `amsp comm-bench --output-table` writes and the planner reads to price a
// collective of a given size on a given group shape.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/traffic.h"

namespace amsp::comm {

struct BandwidthEntry {
  Op op = Op::kAllReduce;
  int64_t ranks_per_node = 1;  // p0
  int64_t nodes = 1;           // p1
  int64_t bytes = 0;           // nccl-tests' size column (traffic.h: bench_size_bytes)
  double time_us = 0;
  double algbw_GBps = 0;
  double busbw_GBps = 0;
};

struct BandwidthTable {
  std::string cluster;
  std::string backend;  // "mpi/thread", "nccl"
  std::string dtype = "float32";
  std::vector<BandwidthEntry> entries;

  // Time of one op of `bytes` on a p0 x p1 group: time interpolated linearly
  // in log(size) between the two nearest measured sizes of that op and shape;
  // below the smallest, the smallest's time (latency bound); above the
  // largest, the largest's bus bandwidth. nullopt if the shape was not measured.
  std::optional<double> time_us(Op op, int64_t ranks_per_node, int64_t nodes,
                                int64_t bytes) const;
};

std::string to_json(const BandwidthTable& t);  // pretty-printed
// Throws UsageError naming the file and what was expected.
BandwidthTable parse_bandwidth_table(const std::string& json_text, const std::string& source);
BandwidthTable load_bandwidth_table(const std::string& path);

}  // namespace amsp::comm
