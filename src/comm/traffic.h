// The collectives, and what each one moves: pure functions, no MPI, so the
// planner and the tests can predict exactly what the communicators account.
//
// Counts are in elements. For all-gather, reduce-scatter and all-to-all
// `count` is the block one rank contributes, receives or sends to each rank
// (count_per_rank); for all-reduce and broadcast it is the whole buffer.
//
// Traffic per rank (what Stats accounts and traffic_bytes returns) is the
// volume a bandwidth-optimal algorithm (ring / pipelined chain) moves through
// one rank's links, the same model nccl-tests' bus bandwidth is normalised to:
//   all-gather      sent = received = (n-1) * count
//   reduce-scatter  sent = received = (n-1) * count
//   all-reduce      sent = received = 2 (n-1) * ceil(count / n)
//                   (a reduce-scatter then an all-gather of padded blocks)
//   broadcast       root: sent = count, received = 0;
//                   others: sent = 0, received = count
//   all-to-all      sent = received = (n-1) * count: a block to and from each
//                   other rank; the rank's own block is a local copy, no bytes
// times the element size; a group of one moves nothing. The MPI library may
// choose another algorithm (recursive doubling, binomial trees): these are the
// figures to compare bandwidths with, not a trace of the wire.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace amsp::comm {

enum class Op { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kAllToAll };
inline constexpr Op kAllOps[] = {Op::kAllGather, Op::kReduceScatter, Op::kAllReduce,
                                 Op::kBroadcast, Op::kAllToAll};
inline constexpr int kNumOps = 5;

// "all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all"
const char* op_name(Op op);
std::optional<Op> parse_op(const std::string& name);  // accepts op_name's spellings

struct Traffic {
  int64_t sent = 0;      // bytes
  int64_t received = 0;  // bytes
  bool operator==(const Traffic&) const = default;
};

// Bytes one rank (index `rank` in a group of `group_size`) sends and receives
// for one collective; `root` only matters for broadcast.
Traffic traffic_bytes(Op op, int64_t count, int64_t group_size, int64_t rank = 0,
                      int64_t root = 0, int64_t elem_bytes = 4);

// Padding for sizes that do not split evenly: callers of all-gather and
// reduce-scatter pass equal blocks. The engine pads its units so they split;
// for anything else, round the buffer up with padded_count, split it in
// block_count-sized blocks and ignore the tail.
inline int64_t block_count(int64_t n, int64_t group_size) {
  return (n + group_size - 1) / group_size;  // ceil(n / group_size)
}
inline int64_t padded_count(int64_t n, int64_t group_size) {
  return block_count(n, group_size) * group_size;
}
// The part of a padded buffer of n real elements that block `index` holds:
// [begin, begin + length), length 0 for blocks wholly in the padding.
struct Span {
  int64_t begin = 0, length = 0;
};
Span real_part_of_block(int64_t n, int64_t group_size, int64_t index);

// nccl-tests' conventions for a benchmark row. `size_bytes` is the size column:
// the whole gathered buffer for all-gather, the whole input for reduce-scatter
// and all-to-all, the buffer for all-reduce and broadcast. algbw = size / time;
// busbw = algbw x factor, with factor 2(n-1)/n for all-reduce, (n-1)/n for
// all-gather, reduce-scatter and all-to-all, 1 for broadcast.
double busbw_factor(Op op, int64_t group_size);
int64_t bench_size_bytes(Op op, int64_t count, int64_t group_size, int64_t elem_bytes = 4);

}  // namespace amsp::comm
