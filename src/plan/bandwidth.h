// Bandwidth tables and cluster descriptions: how long a collective takes.
//
// The table is the one `amsp comm-bench --output-table` writes (format:
// inputs/bandwidth/README.md, reader: comm/bandwidth_table.h): for each op and
// group shape (p0 ranks per node x p1 nodes), the time of one collective at a
// set of sizes (nccl-tests' size column, comm::bench_size_bytes). Between
// measured sizes the time is interpolated linearly in log(size); below the
// smallest size the smallest's time is a latency floor; above the largest the
// largest's bandwidth holds (comm::BandwidthTable::time_us).
//
// A shape the table lacks borrows the nearest measured shape of the same kind
// (inside one node, or spanning nodes): nearest in |log2 p0 - log2 p0'| +
// |log2 p1 - log2 p1'|, ties to the larger group. Bus bandwidth is normalised
// for the group size, so the borrowed time is rescaled by busbw_factor(op, n) /
// busbw_factor(op, n'): the same bus bandwidth, this group's factor
// (doc/planner.md).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "comm/bandwidth_table.h"
#include "comm/traffic.h"
#include "plan/shard_plan.h"

namespace amsp::plan {

class BandwidthTable {
 public:
  BandwidthTable() = default;
  BandwidthTable(const comm::BandwidthTable& table, std::string source);

  bool empty() const { return curves_.empty(); }
  const std::string& source() const { return source_; }
  // The job it was measured on: the most ranks per node and the most nodes of any
  // group (comm-bench's world group). 1x1 when empty.
  MeshShape measured_shape() const;

  // Seconds for one collective whose nccl-tests size is size_bytes, on a group
  // of p0 ranks per node x p1 nodes. A group of one takes no time. Throws
  // UsageError when the table has no shape of the needed kind for the op.
  // An all-to-all the table has no measurement of is priced as a
  // reduce-scatter of the same size.
  double seconds(comm::Op op, int64_t size_bytes, int64_t p0, int64_t p1) const;

 private:
  bool has(comm::Op op, bool inter) const;  // measured on groups within (false) or across nodes
  using Key = std::tuple<int, int64_t, int64_t>;  // op, p0, p1
  std::string source_;
  std::map<Key, comm::BandwidthTable> curves_;    // one op and shape each
};

// Reads an `amsp comm-bench --output-table` file. Throws UsageError naming
// `option` and the file.
BandwidthTable load_bandwidth_table(const std::string& path, const std::string& option);

// What a cluster adds to the bare collective times (doc/planner.md, "What the
// model adds"). Zero for each: not modelled.
struct Effects {
  double contention = 0;          // compute runs 1/(1 + contention) as fast beside a collective
  double jitter_1024 = 0;         // straggler delay per collective over 1024 ranks, a fraction
  int64_t nodes_per_switch = 0;   // nodes under one leaf switch; 0 = one switch
  double oversubscription = 1;    // leaf uplink oversubscription (2 = 2:1)
  double memory_bytes_per_s = 0;  // what the optimizer streams, per rank; 0 = not modelled
};

// A cluster: node shape, memory, compute peak and a bandwidth table.
struct Cluster {
  std::string name;
  std::string source;       // file it came from
  std::string description;
  bool modelled = false;    // the table comes from a model, not a measurement
  int64_t gpus_per_node = 8;
  int64_t gpu_memory = 0;   // bytes
  double peak_tflops_bf16 = 0, peak_tflops_fp32 = 0;
  double achievable = 0.55;  // fraction of peak the matmuls reach
  Effects effects;
  BandwidthTable bandwidth;
};

// A preset name (inputs/clusters/NAME.json) or a path. Throws UsageError
// naming `option`.
Cluster load_cluster(const std::string& name_or_path, const std::string& option);

std::vector<std::string> cluster_preset_names();

}  // namespace amsp::plan
