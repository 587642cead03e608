// The collective benchmark behind `amsp comm-bench` (and benchmarks/comm_bench):
// nccl-tests' method and columns for each op, message size and group shape
// (node-local, across nodes, whole job), with correctness checked in an
// untimed pass, and the measured bandwidth table the planner reads
// (inputs/bandwidth/README.md).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/group.h"
#include "comm/traffic.h"
#include "core/dtype.h"

namespace amsp::comm {

// The group shapes: ranks of one node, one rank per node, everyone.
enum class Shape { kNode, kCross, kWorld };
const char* shape_name(Shape s);  // "node", "cross", "world"

struct BenchOptions {
  std::vector<Op> ops{kAllOps, kAllOps + kNumOps};
  std::vector<Shape> shapes{Shape::kNode, Shape::kCross, Shape::kWorld};
  int64_t min_bytes = 1 << 10;
  int64_t max_bytes = int64_t{256} << 20;
  int64_t step_factor = 2;      // sizes min, min*f, min*f^2, ... <= max
  DType dtype = DType::kF32;    // element type of the messages: fp32 or bf16
  int iters = 20;
  int warmup = 5;
  double max_seconds_per_size = 1.0;  // fewer iterations for large sizes (0: always iters)
  bool check = true;            // the untimed correctness pass
  int ranks_per_node = 0;       // 0: from topology discovery; N: consecutive ranks by N
  std::string cluster;          // name in the table; default SLURM_CLUSTER_NAME or host name
  std::string json_path;        // nccl-tests-like results, every row
  std::string table_path;       // the bandwidth table
};

// "1024", "1K", "256M", "1G", "4KiB" (binary units). Throws UsageError naming `what`.
int64_t parse_bytes(const std::string& text, const std::string& what);
// "1K" for 1024, "256M", "1.5G"; exact bytes below 1 KiB.
std::string format_bytes(int64_t bytes);

// The sizes a run measures: min, min*f, ..., up to max (inclusive), and max itself.
std::vector<int64_t> bench_sizes(int64_t min_bytes, int64_t max_bytes, int64_t factor);

// nccl-tests' name of an element type, as in its type column and in the
// bandwidth table: "float", "bfloat16", "int32", "double".
const char* nccl_type_name(DType t);

// Where the messages live and which communicators move them: host memory and
// MPI (host_message_space), or device memory and NCCL through a compute
// backend (`amsp comm-bench --backend nccl` adapts one). Values pass through
// write/read as floats, converted to and from the element type.
class MessageSpace {
 public:
  virtual ~MessageSpace() = default;
  virtual std::unique_ptr<Communicator> communicator(Group group) = 0;
  // count zeroed elements of type t, freed when the last pointer goes.
  virtual std::shared_ptr<void> alloc(DType t, int64_t count) = 0;
  virtual void write(const float* values, void* dst, DType t, int64_t count) = 0;
  virtual void read(const void* src, float* values, DType t, int64_t count) = 0;
};
std::unique_ptr<MessageSpace> host_message_space();

// Runs the benchmark over MPI_COMM_WORLD (collective; needs an MpiSession).
// Rank 0 prints the tables to `out` and writes the files. Returns the number of
// wrong elements over all ranks (0 when correct).
int64_t run_bench(const BenchOptions& opt, MessageSpace& space, std::ostream& out);

}  // namespace amsp::comm
