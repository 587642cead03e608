// amsp comm-bench: nccl-tests-style collective benchmark; writes the measured
// bandwidth table the planner reads. Run under mpiexec or srun.

#include <iostream>
#include <sstream>

#include "backend/factory.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "comm/bench.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/mpi_check.h"

namespace amsp::cli {
namespace {

// Device memory and NCCL communicators, through the CUDA backend: values cross
// with to_host/from_host, which convert between fp32 and the message dtype.
class BackendMessages final : public comm::MessageSpace {
 public:
  explicit BackendMessages(std::unique_ptr<backend::Backend> be) : be_(std::move(be)) {}
  std::unique_ptr<comm::Communicator> communicator(comm::Group group) override {
    return be_->make_communicator(std::move(group));
  }
  std::shared_ptr<void> alloc(DType t, int64_t count) override {
    auto buffer = std::make_shared<backend::Buffer>(be_->alloc(t, count));
    return std::shared_ptr<void>(buffer, buffer->data());  // keeps the buffer alive
  }
  void write(const float* values, void* dst, DType t, int64_t count) override {
    be_->from_host(values, view(dst, t, count));
    be_->synchronize();
  }
  void read(const void* src, float* values, DType t, int64_t count) override {
    be_->to_host(view(const_cast<void*>(src), t, count), values);
  }

 private:
  backend::View view(void* p, DType t, int64_t count) const {
    return backend::View{p, t, count, be_->device()};
  }
  std::unique_ptr<backend::Backend> be_;
};

// The node-local rank, for choosing this rank's GPU.
int local_rank() {
  MPI_Comm node;
  AMSP_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int rank = 0;
  AMSP_MPI_CHECK(MPI_Comm_rank(node, &rank));
  AMSP_MPI_CHECK(MPI_Comm_free(&node));
  return rank;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace

int run_comm_bench(int argc, char** argv) {
  comm::BenchOptions o;
  std::string ops = "all_gather,reduce_scatter,all_reduce,broadcast,all_to_all", groups = "node,cross,world";
  std::string min_bytes = "1K", max_bytes = "256M", dtype = "fp32", backend_name = "mpi";
  po::options_description desc("Options");
  desc.add_options()
      ("ops", po::value<std::string>(&ops)->default_value(ops)->value_name("LIST"),
           "collectives to measure: all_gather, reduce_scatter, all_reduce, broadcast, all_to_all")
      ("groups", po::value<std::string>(&groups)->default_value(groups)->value_name("LIST"),
           "group shapes: node (the ranks of one node), cross (one rank per node), world")
      ("min-bytes", po::value<std::string>(&min_bytes)->default_value(min_bytes)->value_name("SIZE"),
           "smallest message (nccl-tests' size: the whole gathered/reduced buffer), e.g. 1K")
      ("max-bytes", po::value<std::string>(&max_bytes)->default_value(max_bytes)->value_name("SIZE"),
           "largest message, e.g. 256M or 1G")
      ("backend", po::value<std::string>(&backend_name)->default_value(backend_name)->value_name("mpi|nccl"),
           "mpi: host memory and MPI; nccl: GPU memory and NCCL (one GPU per rank, by node-local rank)")
      ("dtype", po::value<std::string>(&dtype)->default_value(dtype)->value_name("TYPE"),
           "element type of the messages: fp32 or bf16 (bf16 sums accumulate in fp32)")
      ("step-factor", po::value<int64_t>(&o.step_factor)->default_value(o.step_factor)->value_name("INT"),
           "multiply the size by this between rows")
      ("iters", po::value<int>(&o.iters)->default_value(o.iters)->value_name("INT"),
           "timed iterations per size")
      ("warmup", po::value<int>(&o.warmup)->default_value(o.warmup)->value_name("INT"),
           "untimed iterations before timing")
      ("max-seconds", number(&o.max_seconds_per_size, o.max_seconds_per_size)->value_name("SEC"),
           "time budget per size: fewer iterations for the large sizes (0: always --iters)")
      ("check", po::value<bool>(&o.check)->default_value(o.check)->value_name("BOOL"),
           "check every result in an untimed pass")
      ("ranks-per-node", po::value<int>(&o.ranks_per_node)->default_value(0)->value_name("INT"),
           "pretend consecutive ranks form nodes of this size (0: discover the topology)")
      ("cluster", po::value<std::string>(&o.cluster)->value_name("NAME"),
           "cluster name recorded in the table (default: SLURM_CLUSTER_NAME or host name)")
      ("json", po::value<std::string>(&o.json_path)->value_name("FILE"),
           "write every row as JSON")
      ("output-table", po::value<std::string>(&o.table_path)->value_name("FILE"),
           "write the bandwidth table the planner reads (inputs/bandwidth/README.md)");
  po::variables_map vm;
  if (!parse_command("comm-bench",
                     "Measures all-gather, reduce-scatter, all-reduce, broadcast and all-to-all like "
                     "nccl-tests, under mpiexec or srun.",
                     desc, argc, argv, vm))
    return 0;
  o.ops.clear();
  for (const auto& name : split_list(ops)) {
    const auto op = comm::parse_op(name);
    if (!op) fail_usage("--ops ", name, ": expected all_gather, reduce_scatter, all_reduce, broadcast or all_to_all");
    o.ops.push_back(*op);
  }
  o.shapes.clear();
  for (const auto& name : split_list(groups)) {
    if (name == "node") o.shapes.push_back(comm::Shape::kNode);
    else if (name == "cross") o.shapes.push_back(comm::Shape::kCross);
    else if (name == "world") o.shapes.push_back(comm::Shape::kWorld);
    else fail_usage("--groups ", name, ": expected node, cross or world");
  }
  const auto type = parse_dtype(dtype);
  if (!type || (*type != DType::kF32 && *type != DType::kBF16))
    fail_usage("--dtype ", dtype, ": expected fp32 or bf16");
  o.dtype = *type;
  require(!o.ops.empty(), "ops", ops, "at least one collective");
  require(!o.shapes.empty(), "groups", groups, "at least one group shape");
  o.min_bytes = comm::parse_bytes(min_bytes, "min-bytes");
  o.max_bytes = comm::parse_bytes(max_bytes, "max-bytes");
  require(o.min_bytes >= 1, "min-bytes", min_bytes, "a size >= 1 byte");
  require(o.max_bytes >= o.min_bytes, "max-bytes", max_bytes, "a size >= --min-bytes");
  require(o.step_factor >= 2, "step-factor", o.step_factor, "an integer >= 2");
  require(o.iters >= 1, "iters", o.iters, "an integer >= 1");
  require(o.warmup >= 0, "warmup", o.warmup, "an integer >= 0");
  require(o.max_seconds_per_size >= 0, "max-seconds", o.max_seconds_per_size, "seconds >= 0");
  require(o.ranks_per_node >= 0, "ranks-per-node", o.ranks_per_node, "an integer >= 0");

  require(backend_name == "mpi" || backend_name == "nccl", "backend", backend_name, "mpi or nccl");
  if (backend_name == "nccl") backend::check_device_usable(Device::kCuda);

  comm::MpiSession session(&argc, &argv);
  std::unique_ptr<comm::MessageSpace> space;
  if (backend_name == "nccl")
    space = std::make_unique<BackendMessages>(backend::make_backend(
        Device::kCuda, DType::kF32, backend::cuda_device_for(-1, local_rank())));
  else
    space = comm::host_message_space();
  const int64_t wrong = comm::run_bench(o, *space, std::cout);
  return wrong == 0 ? kExitOk : kExitFailure;
}

}  // namespace amsp::cli
