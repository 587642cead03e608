#include "comm/bench.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>

#include "comm/bandwidth_table.h"
#include "core/mpi_check.h"
#include "comm/communicator.h"
#include "comm/group.h"
#include "core/error.h"
#include "core/parse.h"
#include "kernels/common/math.h"
#include "topology/topology.h"

namespace amsp::comm {

const char* shape_name(Shape s) {
  switch (s) {
    case Shape::kNode: return "node";
    case Shape::kCross: return "cross";
    case Shape::kWorld: return "world";
  }
  return "?";
}

int64_t parse_bytes(const std::string& text, const std::string& what) {
  std::string t = text;
  int64_t mult = 1;
  if (t.ends_with("iB")) t.resize(t.size() - 2);
  else if (t.size() > 1 && t.ends_with("B")) t.pop_back();
  if (!t.empty()) {
    switch (std::toupper(static_cast<unsigned char>(t.back()))) {
      case 'K': mult = int64_t{1} << 10; break;
      case 'M': mult = int64_t{1} << 20; break;
      case 'G': mult = int64_t{1} << 30; break;
      default: break;
    }
    if (mult != 1) t.pop_back();
  }
  const auto v = parse_int(t);
  if (!v || *v < 0 || *v > (int64_t{1} << 40) / mult)
    fail_usage("--", what, " ", text, ": expected a size in bytes such as 4096, 1K, 256M or 1G");
  return *v * mult;
}

std::string format_bytes(int64_t b) {
  const char* units[] = {"", "K", "M", "G", "T"};
  int u = 0;
  double v = static_cast<double>(b);
  while (v >= 1024 && u < 4 && std::fmod(v, 1024) == 0) {
    v /= 1024;
    ++u;
  }
  return cat(static_cast<int64_t>(v), units[u]);
}

const char* nccl_type_name(DType t) {
  switch (t) {
    case DType::kF32: return "float";
    case DType::kBF16: return "bfloat16";
    case DType::kI32: return "int32";
    case DType::kF64: return "double";
  }
  return "?";
}

std::vector<int64_t> bench_sizes(int64_t min_bytes, int64_t max_bytes, int64_t factor) {
  std::vector<int64_t> s;
  for (int64_t b = std::max<int64_t>(min_bytes, 1); b <= max_bytes; b *= std::max<int64_t>(factor, 2))
    s.push_back(b);
  if (s.empty() || s.back() != max_bytes) s.push_back(max_bytes);
  return s;
}

namespace {

struct Layout {
  int ranks_per_node = 1, nodes = 1;
  std::vector<int> node_members;   // world ranks of my node, by local rank
  std::vector<int> cross_members;  // the ranks with my local rank, one per node, in node order
  std::string describe;
};

Layout discover_layout(int ranks_per_node) {
  int rank = 0, world = 1;
  AMSP_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  AMSP_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
  Layout l;
  if (ranks_per_node > 0) {
    if (world % ranks_per_node != 0)
      fail_usage("--ranks-per-node ", ranks_per_node, ": must divide the ", world, " ranks");
    l.ranks_per_node = ranks_per_node;
    l.nodes = world / ranks_per_node;
    const int node = rank / ranks_per_node, local = rank % ranks_per_node;
    for (int i = 0; i < ranks_per_node; ++i) l.node_members.push_back(node * ranks_per_node + i);
    for (int n = 0; n < l.nodes; ++n) l.cross_members.push_back(n * ranks_per_node + local);
    l.describe = cat(world, " ranks as ", l.nodes, " pretend nodes of ", ranks_per_node,
                     " (--ranks-per-node)");
    return l;
  }
  const topology::Topology topo = topology::discover(MPI_COMM_WORLD);
  topo.require_equal_tasks_per_node("comm-bench");
  l.ranks_per_node = topo.local_size;
  l.nodes = topo.num_nodes;
  l.node_members = topo.nodes[topo.node].ranks;
  for (int n : topo.node_order) l.cross_members.push_back(topo.nodes[n].ranks[topo.local_rank]);
  l.describe = topo.describe();
  return l;
}

// Deterministic, exactly summable data: small integers (at most 13 + ranks),
// exact in fp32 and, up to 256, in bf16.
float value(int rank, int64_t i) { return static_cast<float>((rank + 1) + (i % 13)); }

// A message buffer of one element type in the message space, with a host copy
// of its values as floats: set/get work on the copy, push/pull move it.
class Buffer {
 public:
  Buffer(MessageSpace& space, DType t, int64_t n, float fill)
      : space_(space), type_(t), values_(static_cast<size_t>(n), fill),
        data_(space.alloc(t, n)) {
    if (fill != 0.0f) push();
  }
  void* data() { return data_.get(); }
  float get(int64_t i) const { return values_[static_cast<size_t>(i)]; }
  void set(int64_t i, float v) { values_[static_cast<size_t>(i)] = v; }
  void push() { space_.write(values_.data(), data_.get(), type_, count()); }
  void pull() { space_.read(data_.get(), values_.data(), type_, count()); }

 private:
  int64_t count() const { return static_cast<int64_t>(values_.size()); }
  MessageSpace& space_;
  DType type_;
  std::vector<float> values_;
  std::shared_ptr<void> data_;
};

// The sum a reduction must produce: fp32 over ranks 0..n-1 in order, rounded
// once to the element type (exact here: the data are small integers).
float reference_sum(DType t, int n, int64_t i) {
  float s = 0;
  for (int r = 0; r < n; ++r) s += value(r, i);
  return t == DType::kBF16 ? kernels::round_bf16(s) : s;
}

// The untimed correctness pass: returns this rank's wrong elements.
int64_t check_op(MessageSpace& space, Communicator& c, Op op, int64_t count, DType t) {
  const int n = c.size(), me = c.rank();
  int64_t wrong = 0;
  switch (op) {
    case Op::kAllGather: {
      Buffer send(space, t, count, 0.0f), recv(space, t, count * n, -1.0f);
      for (int64_t i = 0; i < count; ++i) send.set(i, value(me, i));
      send.push();
      c.all_gather(send.data(), count, recv.data(), t).wait();
      recv.pull();
      for (int r = 0; r < n; ++r)
        for (int64_t i = 0; i < count; ++i) wrong += recv.get(r * count + i) != value(r, i);
      break;
    }
    case Op::kReduceScatter: {
      Buffer send(space, t, count * n, 0.0f), recv(space, t, count, -1.0f);
      for (int64_t i = 0; i < count * n; ++i) send.set(i, value(me, i));
      send.push();
      c.reduce_scatter(send.data(), count, recv.data(), t).wait();
      recv.pull();
      for (int64_t i = 0; i < count; ++i) wrong += recv.get(i) != reference_sum(t, n, me * count + i);
      break;
    }
    case Op::kAllReduce: {
      Buffer buf(space, t, count, 0.0f);
      for (int64_t i = 0; i < count; ++i) buf.set(i, value(me, i));
      buf.push();
      c.all_reduce(buf.data(), count, t).wait();
      buf.pull();
      for (int64_t i = 0; i < count; ++i) wrong += buf.get(i) != reference_sum(t, n, i);
      break;
    }
    case Op::kBroadcast: {
      Buffer buf(space, t, count, -1.0f);
      if (me == 0)
        for (int64_t i = 0; i < count; ++i) buf.set(i, value(0, i));
      buf.push();
      c.broadcast(buf.data(), count, 0, t).wait();
      buf.pull();
      for (int64_t i = 0; i < count; ++i) wrong += buf.get(i) != value(0, i);
      break;
    }
    case Op::kAllToAll: {  // block r of rank me's input goes to rank r
      Buffer send(space, t, count * n, 0.0f), recv(space, t, count * n, -1.0f);
      for (int64_t i = 0; i < count * n; ++i) send.set(i, value(me, i));
      send.push();
      c.all_to_all(send.data(), count, recv.data(), t).wait();
      recv.pull();
      for (int r = 0; r < n; ++r)
        for (int64_t i = 0; i < count; ++i) wrong += recv.get(r * count + i) != value(r, me * count + i);
      break;
    }
  }
  return wrong;
}

// Issues `k` ops back to back (like nccl-tests on a stream) and waits for the last.
void run_ops(Communicator& c, Op op, int64_t count, DType t, int k, Buffer& a, Buffer& b) {
  for (int i = 0; i < k; ++i) {
    switch (op) {
      case Op::kAllGather: c.all_gather(a.data(), count, b.data(), t); break;
      case Op::kReduceScatter: c.reduce_scatter(a.data(), count, b.data(), t); break;
      case Op::kAllReduce: c.all_reduce(a.data(), count, t); break;
      case Op::kBroadcast: c.broadcast(a.data(), count, 0, t); break;
      case Op::kAllToAll: c.all_to_all(a.data(), count, b.data(), t); break;
    }
  }
  c.synchronize();
}

double max_world(double v) {
  AMSP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  return v;
}

// Opens `path` for writing, creating its directory.
std::ofstream open_output(const std::string& path) {
  const auto dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  std::ofstream f(path);
  if (!f) fail("cannot write ", path, ": ", std::strerror(errno));
  return f;
}

std::string default_cluster() {
  if (const char* c = std::getenv("SLURM_CLUSTER_NAME"); c && *c) return c;
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  return host;
}

// A group shape as measured: p0 ranks per node times p1 nodes.
struct ShapedGroup {
  int64_t p0 = 1, p1 = 1;
  Group group;
};

// Creates the group of `shape` that this rank belongs to (collective on the world).
ShapedGroup make_shaped_group(Shape shape, const Layout& layout) {
  ShapedGroup g;
  switch (shape) {
    case Shape::kNode:
      g.p0 = layout.ranks_per_node;
      g.group = make_group(MPI_COMM_WORLD, layout.node_members, "node");
      break;
    case Shape::kCross:
      g.p1 = layout.nodes;
      g.group = make_group(MPI_COMM_WORLD, layout.cross_members, "cross");
      break;
    case Shape::kWorld:
      g.p0 = layout.ranks_per_node;
      g.p1 = layout.nodes;
      g.group = dup_group(MPI_COMM_WORLD, "world");
      break;
  }
  return g;
}

// How long one op of one size took, and over how many timed iterations.
struct Timing {
  double seconds = 0;  // per op, the slowest rank's
  int iters = 0;
};

// One benchmark run: the options, where the ranks are, and what the measurements
// add up to (the bandwidth table, the JSON rows and the wrong-element count).
class BenchRun {
 public:
  BenchRun(const BenchOptions& opt, MessageSpace& space, const Layout& layout, int rank, int world,
           std::ostream& out)
      : opt_(opt), space_(space), layout_(layout), root_(rank == 0), world_(world), out_(out),
        sizes_(bench_sizes(opt.min_bytes, opt.max_bytes, opt.step_factor)) {
    table_.cluster = opt.cluster.empty() ? default_cluster() : opt.cluster;
    // The table's dtype keeps its historical spelling for fp32.
    table_.dtype = opt.dtype == DType::kF32 ? "float32" : nccl_type_name(opt.dtype);
  }

  int64_t run() {
    if (root_) print_preamble();
    for (Shape shape : opt_.shapes) run_shape(shape);
    table_.backend = backend_;
    if (root_) finish();
    return total_wrong_;
  }

 private:
  void print_preamble() {
    out_ << "# amsp comm-bench: " << layout_.describe << "\n"
         << "# warmup " << opt_.warmup << ", iters " << opt_.iters << " (fewer above "
         << opt_.max_seconds_per_size << " s per size), " << table_.dtype << ", check "
         << (opt_.check ? "on" : "off")
         << ", progress " << progress_name(session_progress()) << "\n";
  }

  // Every op on one group shape; a shape with one rank, or one already measured
  // under another name, is skipped (after creating its group, which is collective).
  void run_shape(Shape shape) {
    ShapedGroup g = make_shaped_group(shape, layout_);
    const int64_t p0 = g.p0, p1 = g.p1, n = p0 * p1;
    if (n < 2 || std::find(shapes_done_.begin(), shapes_done_.end(), std::pair{p0, p1}) != shapes_done_.end()) {
      if (root_)
        out_ << "#\n# group " << shape_name(shape) << " (" << p0 << "x" << p1 << "): "
             << (n < 2 ? "a single rank, nothing to measure" : "same shape as above, skipped") << "\n";
      return;
    }
    shapes_done_.push_back({p0, p1});
    auto c = space_.communicator(std::move(g.group));
    backend_ = c->backend();
    for (Op op : opt_.ops) {
      if (root_) print_op_header(op, shape, p0, p1, c->backend());
      for (int64_t bytes : sizes_) run_size(*c, op, shape, p0, p1, bytes);
    }
  }

  void print_op_header(Op op, Shape shape, int64_t p0, int64_t p1, const std::string& backend) {
    char line[256];
    out_ << "#\n# " << op_name(op) << " on group " << shape_name(shape) << ": " << p0 * p1
         << " ranks (" << p0 << " per node x " << p1 << " nodes), backend " << backend
         << "\n";
    std::snprintf(line, sizeof line, "# %12s %12s %8s %6s %6s %12s %8s %8s %8s\n", "size",
                  "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong");
    out_ << line;
    std::snprintf(line, sizeof line, "# %12s %12s %8s %6s %6s %12s %8s %8s %8s\n", "(B)",
                  "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "");
    out_ << line;
  }

  // One row: check, time, print and record one message size.
  void run_size(Communicator& c, Op op, Shape shape, int64_t p0, int64_t p1, int64_t bytes) {
    const int64_t n = p0 * p1, eb = dtype_bytes(opt_.dtype);
    // Elements per call: per rank for all-gather, reduce-scatter and all-to-all.
    const bool blocked = op == Op::kAllGather || op == Op::kReduceScatter || op == Op::kAllToAll;
    const int64_t count = blocked ? bytes / (eb * n) : bytes / eb;
    if (count == 0) return;
    const int64_t size = bench_size_bytes(op, count, n, eb);
    const int64_t total_count = blocked ? count * n : count;

    int64_t wrong = opt_.check ? check_op(space_, c, op, count, opt_.dtype) : 0;
    AMSP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
    total_wrong_ += wrong;
    const Timing timing = time_op(c, op, count, n);
    const double t = timing.seconds;

    const double algbw = static_cast<double>(size) / t / 1e9;
    const double busbw = algbw * busbw_factor(op, n);
    const bool reduces = op == Op::kReduceScatter || op == Op::kAllReduce;
    const DType dtype = opt_.dtype;
    if (root_) {
      char line[256];
      std::snprintf(line, sizeof line, "  %12lld %12lld %8s %6s %6s %12.1f %8.3f %8.3f %8lld\n",
                    static_cast<long long>(size), static_cast<long long>(total_count),
                    nccl_type_name(dtype),
                    reduces ? "sum" : "none", op == Op::kBroadcast ? "0" : "-", t * 1e6, algbw,
                    busbw, static_cast<long long>(wrong));
      out_ << line << std::flush;
    }
    table_.entries.push_back({op, p0, p1, size, t * 1e6, algbw, busbw});
    results_.push_back({{"op", op_name(op)}, {"group", shape_name(shape)}, {"ranks", n},
                        {"ranks_per_node", p0}, {"nodes", p1}, {"size", size},
                        {"count", total_count}, {"type", nccl_type_name(dtype)},
                        {"dtype", dtype_name(dtype)},
                        {"redop", reduces ? "sum" : "none"},
                        {"root", op == Op::kBroadcast ? 0 : -1}, {"time_us", t * 1e6},
                        {"algbw_GBps", algbw}, {"busbw_GBps", busbw}, {"wrong", wrong},
                        {"iters", timing.iters}, {"warmup", opt_.warmup}});
  }

  // One warm-up op prices the size; the rest of the warm-up and the timed
  // iterations then fit the time budget.
  Timing time_op(Communicator& c, Op op, int64_t count, int64_t n) {
    const DType dtype = opt_.dtype;
    const bool a2a = op == Op::kAllToAll;
    Buffer a(space_, dtype, op == Op::kReduceScatter || a2a ? count * n : count, 0.0f);
    Buffer b(space_, dtype, op == Op::kAllGather || a2a ? count * n : count, 0.0f);
    AMSP_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    double t0 = now_seconds();
    run_ops(c, op, count, dtype, 1, a, b);
    const double t_warm = max_world(now_seconds() - t0);
    int warmup = opt_.warmup - 1;
    if (opt_.max_seconds_per_size > 0 && t_warm * warmup > opt_.max_seconds_per_size / 2)
      warmup = static_cast<int>(opt_.max_seconds_per_size / 2 / t_warm);
    if (warmup > 0) run_ops(c, op, count, dtype, warmup, a, b);
    Timing timing;
    timing.iters = opt_.iters;
    if (opt_.max_seconds_per_size > 0 && t_warm * timing.iters > opt_.max_seconds_per_size)
      timing.iters = std::max(1, static_cast<int>(opt_.max_seconds_per_size / t_warm));
    AMSP_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    t0 = now_seconds();
    run_ops(c, op, count, dtype, timing.iters, a, b);
    timing.seconds = max_world((now_seconds() - t0) / timing.iters);
    return timing;
  }

  // Rank 0 only: the verdict, and the JSON rows and bandwidth table if asked for.
  void finish() {
    out_ << "#\n# wrong: " << total_wrong_ << (total_wrong_ ? "  FAILED" : "  OK") << "\n";
    if (!opt_.json_path.empty()) {
      nlohmann::json j = {{"command", "amsp comm-bench"}, {"world_size", world_},
                          {"ranks_per_node", layout_.ranks_per_node}, {"nodes", layout_.nodes},
                          {"layout", layout_.describe}, {"backend", backend_},
                          {"progress", progress_name(session_progress())},
                          {"cluster", table_.cluster}, {"dtype", dtype_name(opt_.dtype)},
                          {"wrong", total_wrong_},
                          {"results", results_}};
      std::ofstream f = open_output(opt_.json_path);
      f << j.dump(1) << "\n";
      if (!f) fail("cannot write ", opt_.json_path);
      out_ << "# results: " << opt_.json_path << "\n";
    }
    if (!opt_.table_path.empty()) {
      std::ofstream f = open_output(opt_.table_path);
      f << to_json(table_);
      if (!f) fail("cannot write ", opt_.table_path);
      out_ << "# bandwidth table: " << opt_.table_path << "\n";
    }
  }

  const BenchOptions& opt_;
  MessageSpace& space_;
  const Layout& layout_;
  const bool root_;
  const int world_;
  std::ostream& out_;
  const std::vector<int64_t> sizes_;

  BandwidthTable table_;
  nlohmann::json results_ = nlohmann::json::array();
  int64_t total_wrong_ = 0;
  std::string backend_;                                 // of the last group measured
  std::vector<std::pair<int64_t, int64_t>> shapes_done_;  // (p0, p1) measured so far
};

}  // namespace

namespace {

// Host memory and MPI communicators.
class HostMessages final : public MessageSpace {
 public:
  std::unique_ptr<Communicator> communicator(Group group) override {
    return make_mpi_communicator(std::move(group));
  }
  std::shared_ptr<void> alloc(DType t, int64_t count) override {
    return std::shared_ptr<void>(std::calloc(static_cast<size_t>(std::max<int64_t>(count, 1)),
                                             static_cast<size_t>(dtype_bytes(t))),
                                 std::free);
  }
  void write(const float* values, void* dst, DType t, int64_t count) override {
    for (int64_t i = 0; i < count; ++i) {
      if (t == DType::kBF16)
        static_cast<uint16_t*>(dst)[i] = kernels::float_to_bf16(values[i]);
      else
        static_cast<float*>(dst)[i] = values[i];
    }
  }
  void read(const void* src, float* values, DType t, int64_t count) override {
    for (int64_t i = 0; i < count; ++i)
      values[i] = t == DType::kBF16 ? kernels::bf16_to_float(static_cast<const uint16_t*>(src)[i])
                                    : static_cast<const float*>(src)[i];
  }
};

}  // namespace

std::unique_ptr<MessageSpace> host_message_space() { return std::make_unique<HostMessages>(); }

int64_t run_bench(const BenchOptions& opt, MessageSpace& space, std::ostream& out) {
  int rank = 0, world = 1;
  AMSP_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  AMSP_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
  const Layout layout = discover_layout(opt.ranks_per_node);
  return BenchRun(opt, space, layout, rank, world, out).run();
}

}  // namespace amsp::comm
