#include "comm/traffic.h"

#include <algorithm>

namespace amsp::comm {

const char* op_name(Op op) {
  switch (op) {
    case Op::kAllGather: return "all_gather";
    case Op::kReduceScatter: return "reduce_scatter";
    case Op::kAllReduce: return "all_reduce";
    case Op::kBroadcast: return "broadcast";
    case Op::kAllToAll: return "all_to_all";
  }
  return "?";
}

std::optional<Op> parse_op(const std::string& name) {
  std::string n = name;
  std::replace(n.begin(), n.end(), '-', '_');
  for (Op op : kAllOps)
    if (n == op_name(op)) return op;
  if (n == "allgather") return Op::kAllGather;
  if (n == "reducescatter") return Op::kReduceScatter;
  if (n == "allreduce") return Op::kAllReduce;
  if (n == "bcast") return Op::kBroadcast;
  if (n == "alltoall") return Op::kAllToAll;
  return std::nullopt;
}

Traffic traffic_bytes(Op op, int64_t count, int64_t n, int64_t rank, int64_t root,
                      int64_t elem_bytes) {
  if (n <= 1 || count <= 0) return {};
  switch (op) {
    case Op::kAllGather:
    case Op::kReduceScatter:
    case Op::kAllToAll: {  // all-to-all: the own block stays local
      const int64_t b = (n - 1) * count * elem_bytes;
      return {b, b};
    }
    case Op::kAllReduce: {
      const int64_t b = 2 * (n - 1) * block_count(count, n) * elem_bytes;
      return {b, b};
    }
    case Op::kBroadcast:
      if (rank == root) return {count * elem_bytes, 0};
      return {0, count * elem_bytes};
  }
  return {};
}

Span real_part_of_block(int64_t n, int64_t group_size, int64_t index) {
  const int64_t b = block_count(n, group_size);
  const int64_t begin = std::min(n, index * b);
  const int64_t end = std::min(n, begin + b);
  return {begin, end - begin};
}

double busbw_factor(Op op, int64_t n) {
  if (n <= 1) return op == Op::kBroadcast ? 1.0 : 0.0;
  switch (op) {
    case Op::kAllReduce: return 2.0 * static_cast<double>(n - 1) / static_cast<double>(n);
    case Op::kAllGather:
    case Op::kReduceScatter:
    case Op::kAllToAll: return static_cast<double>(n - 1) / static_cast<double>(n);
    case Op::kBroadcast: return 1.0;
  }
  return 1.0;
}

int64_t bench_size_bytes(Op op, int64_t count, int64_t n, int64_t elem_bytes) {
  switch (op) {
    case Op::kAllGather:
    case Op::kReduceScatter:
    case Op::kAllToAll: return count * n * elem_bytes;
    case Op::kAllReduce:
    case Op::kBroadcast: return count * elem_bytes;
  }
  return 0;
}

}  // namespace amsp::comm
